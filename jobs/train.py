"""Train a Keras model on a dataset by parameter averaging (a generic spark-submit job).

Example::

    spark-submit --master spark://host:7077 --py-files dist/sparkdl_avg-0.1.0.zip,mymodels.py \\
      jobs/train.py --data hdfs:///data/train.parquet --validation-data hdfs:///data/val.parquet \\
      --model-builder mymodels:build_cnn --features-col image --label-col label \\
      --epochs 10 --num-workers 8 --batch-size 64 --averaging-frequency 16 \\
      --staging-dir hdfs:///tmp/sparkdl_avg --output-dir hdfs:///models/cnn

Reads --data (and --validation-data) with Spark, gets the compiled model from
--model (a .keras file) or --model-builder (MODULE:FUNCTION), checks that the
executors can import sparkdl_avg and TensorFlow, trains with
ParameterAveragingTrainer, evaluates on the validation data, and writes
model.keras, stats.json (per-round timings), metrics.json (history, final
validation metrics, time summary, executors' Python, flags) and report.html
to --output-dir, all at once (an existing directory is only replaced with
--overwrite; one that cannot be written is refused before training, and if
writing fails anyway at the end, the files are kept in a temporary directory
that the error names). With --mlflow-experiment (or --mlflow, --mlflow-tracking-uri,
--mlflow-run-name) the fit is logged to MLflow: params, per-epoch metrics,
the model and the reports, and the final validation metrics as final_val_*;
--resume continues the checkpoint's run. Bad flags or data: one line on
stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from sparkdl_avg import cli  # noqa: E402
from sparkdl_avg.shared.files import fs  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = cli.ArgumentParser(
        prog="train.py", description=__doc__.split("\n\n")[0], epilog="See docs/guides/cluster.md, 'The generic jobs', and the options page (make docs)."
    )
    cli.add_data_args(p)
    p.add_argument("--validation-data", metavar="PATH", default=None,
                   help="held-out data (same format and columns), evaluated on the cluster after every epoch and "
                        "at the end")
    p.add_argument("--validation-split", type=float, default=None, metavar="FRACTION",
                   help="instead of --validation-data: hold out this fraction of --data (randomSplit with --seed)")
    cli.add_model_args(p)
    cli.add_trainer_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--output-dir", required=True, metavar="PATH_OR_URI",
                   help="where model.keras, stats.json, metrics.json and report.html go (local or pyarrow.fs URI)")
    o.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    o.add_argument("--report-title", default=None, help="title of report.html")
    cli.add_tracking_args(p)
    cli.add_cluster_args(p)
    args = p.parse_args(argv)
    if args.validation_split is not None:
        if args.validation_data:
            p.error("give --validation-data or --validation-split, not both")
        if not 0.0 < args.validation_split < 1.0:
            p.error(f"--validation-split must be in (0, 1); got {args.validation_split}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    log = logging.getLogger("train")

    features = cli.columns(args.features_col, "features")
    labels = cli.columns(args.label_col, "label")
    options = cli.read_options(args.read_option)
    out = fs.OutputDir(args.output_dir, overwrite=args.overwrite)
    out.check()  # before any work: refuses an existing or unwritable --output-dir
    if args.checkpoint_dir:
        fs.check_writable(args.checkpoint_dir, "The --checkpoint-dir flag")

    from sparkdl_avg import ParameterAveragingTrainer

    model = cli.load_model(args.model, args.model_builder, seed=args.seed)
    # Validates every option on the driver before Spark starts any job (errors name the flags: cli.run).
    trainer = ParameterAveragingTrainer(model, **cli.trainer_options(args))
    fit = cli.check_fit_flags(args)  # each fit flag and together (initial_epoch < epochs, ...)
    tracker = cli.tracker(args)  # refuses a missing mlflow before Spark starts
    if args.checkpoint_dir and args.validation_split and args.seed is None:
        raise cli.UsageError(
            "--validation-split with --checkpoint-dir needs --seed: a resumed run must split the data the same way."
        )

    spark = cli.spark_session("sparkdl_avg train")
    try:
        needed = cli.needed_columns(args, features, labels)
        data = cli.read_data(spark, args.data, args.format, options, needed)
        validation = None
        if args.validation_data:
            validation = cli.read_data(spark, args.validation_data, args.format, options,
                                       cli.needed_columns(args, features, labels, what="validation"),
                                       "--validation-data")
        elif args.validation_split:
            data, validation = data.randomSplit([1 - args.validation_split, args.validation_split], seed=args.seed)
        executors = cli.check_executors(spark, args.check_executors, trainer.config.preprocess)
        # One line per distinct environment: the probe's tasks often land in one Python on one host.
        for host, python, package in sorted({(i["host"], i["python"], i["sparkdl_avg_file"]) for i in executors}):
            log.info("executor Python %s on %s: sparkdl_avg from %s", python, host, package)

        with trainer:
            history = trainer.fit(
                data,
                **{**fit, "features_col": features, "label_col": labels},
                validation_data=validation,
                callbacks=[tracker] if tracker else None,
            )
            final = trainer.evaluate(validation, features_col=features, label_col=labels, return_dict=True) if validation is not None else None
            if tracker is not None and final is not None:
                tracker.log_evaluation({f"val_{k}": v for k, v in final.items()})
            summary = trainer.stats.summary()
            trainer.write_report(out.file("report.html"), title=args.report_title)
        model.save(out.file("model.keras"))
        trainer.stats.to_json(out.file("stats.json"))
        out.write_json(
            "metrics.json",
            {
                "validation": final,
                "history": history.history,
                "summary": summary,
                "executors": executors,
                "flags": cli.flags_dict(args),
            },
        )
        out.commit(keep_on_error=True)  # the trained model is not lost: the error says where it is
    finally:
        out.cleanup()
        spark.stop()
    if final is not None:
        print("Validation: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
    print(f"Saved model.keras, stats.json, metrics.json and report.html to {args.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
