"""GPU assignment (sparkdl_avg.shared.model.devices) and custom-layer modules (sparkdl_avg.shared.model.custom_objects), without Spark or a GPU."""

import os
import sys

import pytest

from sparkdl_avg.shared.model import custom_objects, devices


class FakeInfo:
    """Like pyspark.resource.ResourceInformation."""

    def __init__(self, name, addresses):
        self.name = name
        self.addresses = addresses


class FakeContext:
    def __init__(self, resources):
        self._resources = resources

    def resources(self):
        return self._resources


@pytest.fixture
def fresh_binding(monkeypatch):
    monkeypatch.setattr(devices, "_BOUND", None)
    monkeypatch.setattr(devices, "_WARNED", set())
    monkeypatch.delenv(devices.VISIBLE_DEVICES_ENV, raising=False)
    monkeypatch.delenv(devices.MEMORY_GROWTH_ENV, raising=False)


def test_assigned_addresses_from_resource_information_and_plain_values():
    assert devices.assigned_addresses({"gpu": FakeInfo("gpu", ["1", "3"])}) == ("1", "3")
    assert devices.assigned_addresses({"gpu": [0, 2]}) == ("0", "2")
    assert devices.assigned_addresses({"fpga": FakeInfo("fpga", ["0"])}) == ()
    assert devices.assigned_addresses({}) == ()
    assert devices.assigned_addresses(None) == ()


@pytest.mark.parametrize(
    "assigned, bound, action",
    [
        ((), None, "none"),
        (("1",), None, "bind"),
        (("1",), ("1",), "keep"),
        (("0", "1"), ("0", "1"), "keep"),
        (("0",), ("1",), "mismatch"),
        ((), ("1",), "keep"),
    ],
)
def test_decide(assigned, bound, action):
    assert devices.decide(assigned, bound) == action


def test_device_environment_lists_addresses_and_turns_on_memory_growth():
    assert devices.device_environment(["2", "5"]) == {
        "CUDA_VISIBLE_DEVICES": "2,5",
        "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    }
    with pytest.raises(ValueError, match="at least one GPU address"):
        devices.device_environment([])


def test_apply_binding_binds_once_and_keeps_a_users_memory_growth_setting():
    env = {"TF_FORCE_GPU_ALLOW_GROWTH": "false"}
    first = devices.apply_binding(("3",), None, env)
    assert first == devices.DeviceBinding(("3",), ("3",), "bind")
    assert env == {"CUDA_VISIBLE_DEVICES": "3", "TF_FORCE_GPU_ALLOW_GROWTH": "false"}
    # A later task of the same process with other GPUs changes nothing.
    later = devices.apply_binding(("1",), first.bound, env)
    assert later == devices.DeviceBinding(("1",), ("3",), "mismatch")
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    # No GPU resource: the environment is left alone.
    empty = {}
    assert devices.apply_binding((), None, empty).action == "none" and empty == {}


def test_configure_task_devices_binds_the_process_to_the_tasks_gpus(fresh_binding, caplog):
    env = {}
    binding = devices.configure_task_devices(FakeContext({"gpu": FakeInfo("gpu", ["1"])}), env)
    assert binding.action == "bind" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert devices._BOUND == ("1",)
    assert devices.configure_task_devices(FakeContext({"gpu": FakeInfo("gpu", ["1"])}), env).action == "keep"
    with caplog.at_level("WARNING", logger="sparkdl_avg.shared.model.devices"):
        mismatch = devices.configure_task_devices(FakeContext({"gpu": FakeInfo("gpu", ["0"])}), env)
        devices.configure_task_devices(FakeContext({"gpu": FakeInfo("gpu", ["0"])}), env)
    assert mismatch.action == "mismatch" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert len([r for r in caplog.records if "keeps using them" in r.message]) == 1  # warned once


def test_configure_task_devices_outside_spark_changes_nothing(fresh_binding):
    env = {}
    assert devices.configure_task_devices(None, env).action == "none"  # TaskContext.get() is None here
    assert devices.configure_task_devices(FakeContext({}), env).action == "none"
    assert env == {} and devices._BOUND is None


def test_worker_binds_gpus_before_it_looks_up_the_replica(fresh_binding, monkeypatch):
    """The wiring in sparkdl_avg.executor.worker.get_replica, with a fake task context."""
    import pyspark

    from sparkdl_avg.executor import worker

    monkeypatch.setattr(pyspark.TaskContext, "get", classmethod(lambda cls: FakeContext({"gpu": FakeInfo("gpu", ["7"])})))
    monkeypatch.setitem(worker._REPLICAS, "fake-fingerprint", "cached replica")
    assert worker.get_replica(None, "fake-fingerprint") == ("cached replica", False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "7"
    assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert devices._BOUND == ("7",)


# ------------------------------------------------------------ custom objects


def test_custom_modules_lists_registered_non_keras_modules():
    config = {
        "module": "keras",
        "class_name": "Sequential",
        "registered_name": None,
        "config": {
            "layers": [
                {"module": "keras.layers", "class_name": "Dense", "registered_name": None},
                {"module": "mymodels.layers", "class_name": "Rescale", "registered_name": "mymodels>Rescale"},
                {"module": "keras_hub.layers", "class_name": "X", "registered_name": "keras_hub>X"},
                {"module": "mymodels.layers", "class_name": "Other", "registered_name": "mymodels>Other"},
                {"module": "other", "class_name": "NotRegistered", "registered_name": None},
            ]
        },
        "compile_config": {"loss": {"module": "losses_mod", "class_name": "f", "registered_name": "custom>f"}},
    }
    assert custom_objects.custom_modules(config) == ["mymodels.layers", "losses_mod"]


def test_import_custom_modules_makes_a_model_with_a_custom_layer_loadable(tmp_path, monkeypatch):
    import keras

    module_dir = tmp_path / "mods"
    module_dir.mkdir()
    (module_dir / "sdl_custom_layer.py").write_text(
        "import keras\n"
        "@keras.saving.register_keras_serializable(package='sdl_custom_layer')\n"
        "class Double(keras.layers.Layer):\n"
        "    def call(self, x):\n"
        "        return 2 * x\n"
    )
    monkeypatch.syspath_prepend(str(module_dir))
    import sdl_custom_layer

    model = keras.Sequential([keras.Input((3,)), sdl_custom_layer.Double(), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    path = str(tmp_path / "m.keras")
    model.save(path)
    data = open(path, "rb").read()

    # As on a fresh executor: the module is not imported and the class not registered.
    monkeypatch.delitem(sys.modules, "sdl_custom_layer")
    registry = keras.saving.get_custom_objects()
    monkeypatch.delitem(registry, "sdl_custom_layer>Double")
    with pytest.raises(Exception, match="Could not locate class 'Double'"):
        keras.saving.load_model(path)
    assert custom_objects.import_custom_modules(data) == ["sdl_custom_layer"]
    loaded = keras.saving.load_model(path)
    assert type(loaded.layers[0]).__name__ == "Double"
    assert custom_objects.import_custom_modules(b"not a zip") == []
