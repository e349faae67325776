"""The sparse codecs (``update_compression="topk"``, ``"threshold"``) against float32 in whole fits, by update rule and
``k`` (docs/benchmarks/sparse_codecs.md).

README's session (``local[2]``), 2 workers, batch 32, ``optimizer_state="local"``, seeds 0, 1, 2, the datasets and
models of ``compressed_training.py`` (Adam(1e-3) inside): ``--dataset digits``, the 64-64-10 MLP (1,500 examples,
held-out 297, 10 epochs by default); ``--dataset cnn``, the suite CNN (20,000 synthetic 28×28 images, held-out
2,000, 3 epochs by default). Each arm is ``RULE/COMPRESSION`` (``none``: float32); prints each arm's held-out
accuracies, their median, the bytes a worker sent per round and the bytes of state the driver sent out per round (the
mean over the fit's rounds: the ``"spark"`` transport's bases and patches, docs/benchmarks/sparse_codecs.md)::

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python benchmarks/sparse_codecs.py --k 4 \\
        diloco:outer_momentum=0.5/none diloco:outer_momentum=0.5/topk

``--rebase-share`` and ``--chain-share`` set :data:`sparkdl_avg.shared.wire.state_patch.REBASE_SHARE` and
:data:`~sparkdl_avg.shared.wire.state_patch.CHAIN_SHARE` for the run (how their defaults were chosen, with
``--state-transport spark``: on one host ``"auto"`` sends the state through another path, whole).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--k", type=int, default=4, help="averaging_frequency (digits: 23 minibatches a worker an epoch)")
    p.add_argument("--dataset", default="digits", choices=["digits", "cnn"])
    p.add_argument("--epochs", type=int, default=None, help="default: the dataset's (digits 10, cnn 3)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rebase-share", type=float, default=None, help="default: the library's REBASE_SHARE")
    p.add_argument("--chain-share", type=float, default=None, help="default: the library's CHAIN_SHARE")
    p.add_argument("--state-transport", default="auto",
                   help='state_transport (its patches: "spark"; on one host "auto" takes another path)')
    p.add_argument("arms", nargs="+", metavar="RULE/COMPRESSION")
    args = p.parse_args()

    from pyspark.sql import SparkSession

    import sparkdl_avg
    from sparkdl_avg.shared.wire import state_patch

    if args.rebase_share is not None:
        state_patch.REBASE_SHARE = args.rebase_share
    if args.chain_share is not None:
        state_patch.CHAIN_SHARE = args.chain_share

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from compressed_training import datasets, model_for

    spark = SparkSession.builder.master("local[2]").config(map=sparkdl_avg.RECOMMENDED_CONF).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    d = datasets()[args.dataset]
    (x, y), (xt, yt) = d["data"], d["test"]
    epochs = args.epochs or d["epochs"]

    for arm in args.arms:
        rule, compression = arm.rsplit("/", 1)
        accuracies, sent, state = [], [], []
        for seed in args.seeds:
            model = model_for(args.dataset, seed)
            trainer = sparkdl_avg.ParameterAveragingTrainer(
                model, num_workers=2, batch_size=32, averaging_frequency=args.k, seed=seed, optimizer_state="local",
                update_rule=rule, update_compression=None if compression == "none" else compression,
                state_transport=args.state_transport,
                slow_warning=False)
            trainer.fit((x, y), epochs=epochs, verbose=0)
            accuracies.append(float(model.evaluate(xt, yt, verbose=0)[1]))
            sent.append(statistics.median(r.sent_bytes / r.num_workers for r in trainer.stats.records))
            state.append(statistics.mean(r.state_bytes for r in trainer.stats.records))
        print(f"{args.dataset} k={args.k} rounds={len(trainer.stats.records)} {arm}: accuracy {[round(a, 4) for a in accuracies]} "
              f"median {statistics.median(accuracies):.4f}; bytes/worker/round {statistics.median(sent):.0f}; "
              f"state out/round {statistics.median(state):.0f}",
              flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
