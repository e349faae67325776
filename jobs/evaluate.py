"""Evaluate a saved Keras model on a dataset, on the cluster (a spark-submit job).

Example::

    spark-submit --py-files dist/sparkdl_avg-0.1.0.zip jobs/evaluate.py \\
      --model hdfs:///models/cnn/model.keras --data hdfs:///data/test.parquet \\
      --features-col image --label-col label --output hdfs:///models/cnn/test_metrics.json

Computes the model's compiled loss and metrics (example-weighted, equal to
keras.Model.evaluate for mean-type metrics) with the trainer's distributed
evaluate, prints them as JSON on stdout and, with --output, writes them to a
JSON file (local or pyarrow.fs URI; written whole). Bad flags or data: one
line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from sparkdl_avg import cli  # noqa: E402
from sparkdl_avg.shared.files import fs  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="evaluate.py", description=__doc__.split("\n\n")[0])
    cli.add_data_args(p)
    cli.add_model_args(p, builder=False)
    p.add_argument("--num-workers", type=int, default=None, help="evaluation tasks (default: defaultParallelism)")
    p.add_argument("--batch-size", type=int, default=256, help="examples per evaluation minibatch (default 256)")
    p.add_argument("--staging-dir", default=None, metavar="PATH_OR_URI", help="where the data is staged (see train.py)")
    p.add_argument("--output", default=None, metavar="PATH_OR_URI", help="also write the metrics to this JSON file")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    cli.add_cluster_args(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    features = cli.columns(args.features_col, "features")
    labels = cli.columns(args.label_col, "label")
    options = cli.read_options(args.read_option)
    if args.output and not args.overwrite:
        fs.refuse_existing(args.output)

    from sparkdl_avg import ParameterAveragingTrainer

    model = cli.load_model(args.model)
    trainer = ParameterAveragingTrainer(
        model, num_workers=args.num_workers, batch_size=args.batch_size, staging_dir=args.staging_dir,
        preprocess=args.preprocess,
    )
    spark = cli.spark_session("sparkdl_avg evaluate")
    try:
        data = cli.read_data(spark, args.data, args.format, options, cli.needed_columns(args, features, labels))
        cli.check_executors(spark, args.check_executors, args.preprocess)
        with trainer:
            metrics = trainer.evaluate(data, features_col=features, label_col=labels, return_dict=True,
                                       sample_weight_col=args.sample_weight_col)
    finally:
        spark.stop()
    text = json.dumps(metrics, indent=1)
    if args.output:
        fs.write_atomically(args.output, text.encode(), overwrite=args.overwrite)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
