"""Add a saved Keras model's predictions to a dataset and write it as Parquet (a spark-submit job).

Example::

    spark-submit --py-files dist/sparkdl_avg-0.1.0.zip jobs/predict.py \\
      --model hdfs:///models/cnn/model.keras --data hdfs:///data/new.parquet \\
      --features-col image --keep-cols id --output hdfs:///predictions/cnn

Runs the trainer's distributed predict (an iterator pandas UDF, one cached
replica per Python worker): for a classifier ``prediction`` is the class
index and ``probability`` the class probabilities, else ``prediction`` holds
the output value(s). Writes Parquet with Spark (its commit protocol: the
directory appears whole, with ``_SUCCESS``); an existing output is only
replaced with --overwrite. Bad flags or data: one line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from sparkdl_avg import cli  # noqa: E402
from sparkdl_avg.shared.files import fs  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(prog="predict.py", description=__doc__.split("\n\n")[0])
    cli.add_data_args(p, label=False)
    cli.add_model_args(p, builder=False)
    p.add_argument("--output", required=True, metavar="PATH",
                   help="Parquet output directory (any path Spark writes: local, hdfs://, s3a://, ...)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--keep-cols", action="append", default=None, metavar="COL",
                   help="input columns to keep next to the predictions (repeatable or comma list); default: all "
                        "but the features")
    p.add_argument("--prediction-col", default="prediction", help="output column (default prediction)")
    p.add_argument("--probability-col", default="probability",
                   help="classifiers' probability column (default probability; 'none' omits it)")
    p.add_argument("--batch-size", type=int, default=1024, help="examples per predict_on_batch call (default 1024)")
    cli.add_cluster_args(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    features = cli.columns(args.features_col, "features")
    options = cli.read_options(args.read_option)
    probability = None if args.probability_col.lower() == "none" else args.probability_col

    from sparkdl_avg import ParameterAveragingTrainer

    model = cli.load_model(args.model, compiled=False)
    spark = cli.spark_session("sparkdl_avg predict")
    try:
        keep = cli.as_list(cli.columns(args.keep_cols, "")) if args.keep_cols else None
        data = cli.read_data(spark, args.data, args.format, options, cli.needed_columns(args, features, keep or []))
        if not args.overwrite and fs.hadoop_exists(spark.sparkContext, args.output):
            raise cli.UsageError(f"Output {args.output!r} already exists; pass --overwrite to replace it")
        cli.check_executors(spark, args.check_executors, args.preprocess)
        trainer = ParameterAveragingTrainer(model, batch_size=32, preprocess=args.preprocess)
        out = trainer.predict(data, features_col=features, prediction_col=args.prediction_col,
                              probability_col=probability, batch_size=args.batch_size)
        dropped = set() if args.preprocess is not None else set(cli.as_list(features))
        kept = keep if keep is not None else [c for c in data.columns if c not in dropped]
        new = [args.prediction_col] + ([probability] if probability and probability in out.columns else [])
        out.select(*kept, *new).write.mode("overwrite" if args.overwrite else "errorifexists").parquet(args.output)
        rows = spark.read.parquet(args.output).count()
    finally:
        spark.stop()
    print(f"Wrote {rows} predictions to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
