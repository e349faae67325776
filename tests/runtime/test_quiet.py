"""TensorFlow's start-up notices are filtered from stderr; every other line passes (sparkdl_avg.shared.model.quiet)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.integration  # tests/conftest.py: not in make test-fast's unit tier


def _stderr_of(code: str) -> str:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          check=True).stderr


def test_filtered_stderr_drops_tensorflows_notices_and_keeps_everything_else():
    # Written to file descriptor 2 directly, as TensorFlow's C++ runtime does.
    err = _stderr_of(r'''
        import os
        from sparkdl_avg.shared.model.quiet import filtered_stderr
        lines = [
            "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
            "I0000 00:00:1796123049.207948   24970 port.cc:153] oneDNN custom operations are on. You may see x",
            "I0000 00:00:1796123049.209046   24970 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.",
            "E0000 00:00:1796123051.212007   24970 some_kernel.cc:52] a real error",
            "Traceback (most recent call last): the user's own",
        ]
        with filtered_stderr():
            for line in lines:
                os.write(2, (line + "\n").encode())
        os.write(2, b"after the block\n")
    ''')
    assert err.splitlines() == [
        "E0000 00:00:1796123051.212007   24970 some_kernel.cc:52] a real error",
        "Traceback (most recent call last): the user's own",
        "after the block",
    ]


def test_import_tensorflow_prints_none_of_its_start_up_notices():
    err = _stderr_of("""
        from sparkdl_avg.shared.model.quiet import import_tensorflow
        tf = import_tensorflow(devices=True)
        assert float(tf.constant(1.0) + 1) == 2.0
    """)
    assert "oneDNN" not in err and "cuda drivers" not in err and "absl::InitializeLog" not in err, err


def test_an_executor_imports_tensorflow_and_keras_without_their_optional_integrations():
    # Issue 48: scikit-learn (with scipy) and matplotlib were a sixth of an executor's import before its first round.
    code = """
        import os, sys
        os.environ["PYTHON_WORKER_FACTORY_SECRET"] = "x"  # what PySpark gives its workers and daemon
        from sparkdl_avg.shared.model import quiet
        assert quiet.on_executor()
        tf = quiet.import_tensorflow()
        import keras
        skipped = [m for m in quiet.EXECUTOR_SKIPPED_IMPORTS if m in sys.modules]
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        model.fit(tf.ones((4, 2)), tf.ones((4, 1)), verbose=0)
        import sklearn  # afterwards, a user's function imports them as usual
        print("skipped during the import:", skipped, "sklearn later:", sklearn.__name__)
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    assert "skipped during the import: [] sklearn later: sklearn" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("users, expected", [(None, "1 True"), ("0", "0 False")])
def test_an_executor_runs_tensorflows_onednn_kernels_unless_the_user_chose(users, expected):
    # TensorFlow turns oneDNN on by itself only on CPUs with AVX-512 VNNI; its Eigen kernels took a whole fit of
    # the benchmarks' CNN 1.5x as long on an AMD EPYC (docs/benchmarks/cnn.md).
    code = """
        import os
        os.environ["PYTHON_WORKER_FACTORY_SECRET"] = "x"
        import sparkdl_avg.executor.predict
        from tensorflow.python.util import _pywrap_util_port
        print("onednn:", os.environ["TF_ENABLE_ONEDNN_OPTS"], _pywrap_util_port.IsMklEnabled())
    """
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    if users is not None:
        env["TF_ENABLE_ONEDNN_OPTS"] = users
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True,
                         env=env)
    assert f"onednn: {expected}" in out.stdout, out.stdout + out.stderr


def test_the_driver_leaves_tensorflows_choice_of_kernels_to_tensorflow():
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    out = subprocess.run([sys.executable, "-c", "import os, sparkdl_avg\n"
                          "print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'))"],
                         capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "None", out.stdout + out.stderr  # the user's own Keras, as without sparkdl_avg


def test_an_executor_imports_the_task_code_without_the_drivers_api_and_finds_public_names_when_asked():
    # Issue 48: the driver's API (PySpark ML, and pandas with it) was 0.5 s of CPU of a Python worker's start.
    code = """
        import os, sys
        os.environ["PYTHON_WORKER_FACTORY_SECRET"] = "x"
        import sparkdl_avg.executor.worker, sparkdl_avg.executor.predict
        loaded = [m for m in ("sparkdl_avg.api", "sparkdl_avg.driver", "pyspark.ml", "pandas") if m in sys.modules]
        print("loaded:", loaded, sparkdl_avg.__version__)
        print("asked:", sparkdl_avg.decode_images.__module__, "sparkdl_avg.api" in sys.modules)
        try:
            sparkdl_avg.ParameterAveragingTrainr
        except AttributeError as e:
            print("error:", e)
    """
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True)
    from sparkdl_avg import __version__

    assert f"loaded: [] {__version__}" in out.stdout, out.stdout + out.stderr
    assert "asked: sparkdl_avg.shared.data.preprocess True" in out.stdout, out.stdout
    assert "error: module 'sparkdl_avg' has no attribute 'ParameterAveragingTrainr'" in out.stdout, out.stdout


def test_the_driver_imports_tensorflow_with_keras_whole():
    out = subprocess.run([sys.executable, "-c", "import importlib.util, sys, sparkdl_avg\n"
                          "print('sklearn' in sys.modules or importlib.util.find_spec('sklearn') is None)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True", out.stderr  # Keras' scikit-learn wrappers work in the user's process
