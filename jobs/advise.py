"""Should this model be trained on the cluster? Measure, predict and answer (a spark-submit job).

Example::

    spark-submit --master spark://host:7077 --py-files dist/sparkdl_avg-0.1.0.zip,mymodels.py \\
      jobs/advise.py --data hdfs:///data/train.parquet --model-builder mymodels:build_cnn \\
      --epochs 20 --batch-size 64 --averaging-frequency 32 --output advice.html

Runs sparkdl_avg.advise on the job's session and data within --budget
seconds: one process's keras.Model.fit throughput on the driver, a few
short fits on the executors, the one-off costs. Prints the answer in words
and the table of predicted epoch time, efficiency and speed-up by workers and
averaging frequency; with --output writes them with the plot to an HTML file
(and the numbers to the same name with .json). Bad flags or data: one line
on stderr, exit status 2.
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
    p = cli.ArgumentParser(prog="advise.py", description=__doc__.split("\n\n")[0])
    cli.add_data_args(p)
    cli.add_model_args(p)
    g = p.add_argument_group("the planned training")
    g.add_argument("--epochs", type=int, default=10, help="epochs you plan to train (default 10)")
    g.add_argument("--batch-size", type=int, default=32, help="examples per minibatch, per worker (default 32)")
    g.add_argument("--averaging-frequency", type=int, default=None, metavar="K",
                   help="the averaging frequency you plan; compared with 1, 4, 16, 64, 256 (default: those)")
    g.add_argument("--budget", type=float, default=60.0, metavar="SECONDS",
                   help="seconds the measurement may take, roughly; at least 10 (default 60)")
    g.add_argument("--max-workers", type=int, default=None,
                   help="largest worker count to predict, extrapolated beyond the parallelism (default 8x it)")
    g.add_argument("--staging-dir", default=None, metavar="PATH_OR_URI", help="where the sample is staged (see train.py)")
    g.add_argument("--seed", type=int, default=0, help="seed of --model-builder (default 0)")
    o = p.add_argument_group("output")
    o.add_argument("--output", default=None, metavar="PATH_OR_URI",
                   help="write the answer, table and plot to this HTML file, and the numbers to the .json beside it")
    o.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    cli.add_cluster_args(p)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    features = cli.columns(args.features_col, "features")
    labels = cli.columns(args.label_col, "label")
    options = cli.read_options(args.read_option)
    json_path = None
    if args.output:
        json_path = os.path.splitext(args.output)[0] + ".json"
        for path in (args.output, json_path) if not args.overwrite else ():
            fs.refuse_existing(path)

    from sparkdl_avg import advise

    model = cli.load_model(args.model, args.model_builder, seed=args.seed)
    spark = cli.spark_session("sparkdl_avg advise")
    try:
        data = cli.read_data(spark, args.data, args.format, options, cli.as_list(features) + cli.as_list(labels))
        cli.check_executors(spark, args.check_executors)
        advice = advise(model, data, epochs=args.epochs, batch_size=args.batch_size,
                        averaging_frequency=args.averaging_frequency, features_col=features, label_col=labels,
                        budget_s=args.budget, max_workers=args.max_workers, staging_dir=args.staging_dir)
    finally:
        spark.stop()
    print(advice)
    if args.output:
        advice.write_html(args.output)
        fs.write_atomically(json_path, json.dumps(advice.to_dict(), indent=1).encode())
        print(f"Wrote {args.output} and {json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main))
