"""Training on PNG files: the trainer with a decoding preprocessing function against one-process ``tf.data``.

The suite's CNN (``bench_cnn.py``: 31k parameters, 28×28×1, 10 classes) on
N synthetic images written as PNG files (``tf.io.encode_png``; one folder
per class, nothing downloaded). Both arms read the same files, decode them
the same way and augment every example with a random horizontal flip and a
random crop (pad 2 pixels, crop back to 28×28):

* ``tf.data`` (one process, TensorFlow on both cores): ``list_files`` →
  ``read_file`` → ``decode_png`` + augmentation (``map`` with
  ``num_parallel_calls=AUTOTUNE``), ``shuffle``, ``batch``, ``prefetch``,
  ``model.fit``;
* ``trainer`` on ``local[2]``: ``spark.read.format("binaryFile")``, the label
  from the path, ``ParameterAveragingTrainer(preprocess=decode_augment)``
  with README's settings, 2 workers, ``averaging_frequency`` k (32 and
  128); the images decoded with ``sparkdl_avg.decode_images``, the
  augmentation vectorised and seeded per example (``seeds``).

Each arm trains ``--epochs`` epochs from the same initial weights; the first
epoch (tracing, staging, replicas built) is reported apart and the later
ones' median is the epoch time. Arms alternate, ``--repeats`` times;
held-out accuracy on decoded test images. Also records the staged bytes
against the files' bytes and the seconds staging took (before the first
epoch: one Spark task per partition binaryFile makes). Usage::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/python benchmarks/png_training.py

Results go to ``benchmarks/results/png_training.json``.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import harness  # noqa: E402
from bench_cnn import EpochTimer, build_model, make_data  # noqa: E402


def decode_augment(batch, seeds=None, training=False):
    """The trainer's preprocessing: PNG bytes → 28×28×1 float32; in training a seeded flip and a 2-pixel crop.

    Decoded in one graph call per minibatch (``sparkdl_avg.decode_images``); the augmentation is vectorised,
    each example's choices taken from its seed (uniform 63-bit integers), so it repeats bitwise.
    """
    from sparkdl_avg import decode_images

    images = decode_images(batch["content"], channels=1).astype(np.float32) / 255.0
    if training:
        n = len(images)
        padded = np.pad(images, ((0, 0), (2, 2), (2, 2), (0, 0)))
        dy, dx, flip = seeds % 5, (seeds // 5) % 5, (seeds // 25) % 2 == 1
        rows = dy[:, None] + np.arange(28)[None, :]
        cols = dx[:, None] + np.arange(28)[None, :]
        images = padded[np.arange(n)[:, None, None], rows[:, :, None], cols[:, None, :]]
        images[flip] = images[flip, :, ::-1]
    return {"image": images}


def write_pngs(directory: str, x: np.ndarray, y: np.ndarray) -> int:
    """Writes ``x`` (floats) as ``directory/<label>/<i>.png``; returns the files' bytes."""
    import tensorflow as tf

    low, high = float(x.min()), float(x.max())
    pixels = np.clip(np.round((x - low) / (high - low) * 255), 0, 255).astype(np.uint8)
    total = 0
    for i, (image, label) in enumerate(zip(pixels, y)):
        folder = os.path.join(directory, str(label))
        os.makedirs(folder, exist_ok=True)
        data = tf.io.encode_png(image).numpy()
        total += len(data)
        with open(os.path.join(folder, f"{i:06d}.png"), "wb") as f:
            f.write(data)
    return total


def run_tf_data(directory, test, weights, epochs, batch):
    import tensorflow as tf

    def load(path):
        image = tf.cast(tf.io.decode_png(tf.io.read_file(path)), tf.float32) / 255.0
        label = tf.strings.to_number(tf.strings.split(path, os.sep)[-2], tf.int32)
        return image, label

    def augment(image, label):
        image = tf.image.random_crop(tf.pad(image, [[2, 2], [2, 2], [0, 0]]), (28, 28, 1))
        return tf.image.random_flip_left_right(image), label

    files = tf.data.Dataset.list_files(os.path.join(directory, "*", "*.png"), shuffle=False)
    data = (files.shuffle(100_000, reshuffle_each_iteration=True)
            .map(load, num_parallel_calls=tf.data.AUTOTUNE).map(augment, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch).prefetch(tf.data.AUTOTUNE))
    model = build_model(weights)
    timer = EpochTimer()
    model.fit(data, epochs=epochs, verbose=0, callbacks=[timer])
    return {"epoch_s": timer.times, "accuracy": float(model.evaluate(*test, verbose=0)[1])}


def run_trainer(files, test, weights, epochs, batch, k, workers):
    from sparkdl_avg import ParameterAveragingTrainer

    model = build_model(weights)
    timer = EpochTimer()
    with ParameterAveragingTrainer(model, num_workers=workers, batch_size=batch, averaging_frequency=k, seed=1,
                                   preprocess=decode_augment) as trainer:
        trainer.fit(files, features_col="image", label_col="label", epochs=epochs, verbose=0, callbacks=[timer])
        summary = trainer.stats.summary()
    return {"epoch_s": timer.times, "accuracy": float(model.evaluate(*test, verbose=0)[1]),
            "staged_bytes": summary["staged_bytes"], "compute_share": summary["compute_share"],
            "staging_s": trainer.stats.staging_s,
            "overhead_s_median": summary["overhead_s_median"]}


def main() -> None:
    p = harness.parser(__doc__, out="png_training.json", repeats=3)
    p.add_argument("--examples", type=int, default=16000)
    p.add_argument("--test-examples", type=int, default=4000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--averaging-frequencies", type=int, nargs="+", default=[32, 128])
    args = p.parse_args()

    x, y = make_data(args.examples + args.test_examples, seed=4)
    directory = tempfile.mkdtemp(prefix="sparkdl_avg-png-")
    file_bytes = write_pngs(directory, x[: args.examples], y[: args.examples])
    low, high = float(x.min()), float(x.max())
    test = (np.round(np.clip((x[args.examples:] - low) / (high - low), 0, 1) * 255) / 255.0).astype(np.float32), \
        y[args.examples:]
    weights = build_model().get_weights()
    spark = harness.session("local[2]")
    from pyspark.sql import functions as F

    files = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(directory)
             .withColumn("label", F.regexp_extract("path", r"/(\d+)/[^/]+$", 1).cast("int")))
    arms = {"keras + tf.data (1 process)": lambda: run_tf_data(directory, test, weights, args.epochs, args.batch_size)}
    for k in args.averaging_frequencies:
        arms[f"trainer local[2] k={k}"] = lambda k=k: run_trainer(files, test, weights, args.epochs, args.batch_size,
                                                                   k, 2)
    runs = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, fn in arms.items():
            runs[name].append(fn())
            r = runs[name][-1]
            print(f"{name}: epochs {[round(t, 2) for t in r['epoch_s']]} accuracy {r['accuracy']:.3f}", flush=True)
    partitions = files.rdd.getNumPartitions()
    spark.stop()

    rows = []
    for name, rs in runs.items():
        later = [t for r in rs for t in r["epoch_s"][1:]]
        rows.append({"arm": name, "epoch_s_median": statistics.median(later),
                     "first_epoch_s_median": statistics.median(r["epoch_s"][0] for r in rs),
                     "accuracy_median": statistics.median(r["accuracy"] for r in rs)})
    base = rows[0]["epoch_s_median"]
    for r in rows:
        r["ratio_to_tf_data"] = r["epoch_s_median"] / base
    staged = statistics.median(r["staged_bytes"] for r in runs[list(arms)[1]])
    staging_s = statistics.median(r["staging_s"] for name in list(arms)[1:] for r in runs[name])
    harness.write_results(args.out, args, runs=runs, rows=rows, file_bytes=file_bytes, staged_bytes=staged,
                          staging_s_median=staging_s, partitions=partitions)
    print("| arm | epoch (median of epochs 2+) | first epoch | ratio to tf.data | held-out accuracy |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arm']} | {r['epoch_s_median']:.2f} s | {r['first_epoch_s_median']:.2f} s | "
              f"{r['ratio_to_tf_data']:.2f} | {r['accuracy_median']:.3f} |")
    print(f"staged {staged} bytes for {file_bytes} bytes of PNG files ({staged / file_bytes:.3f}x; the rest: "
          f"paths, labels, offsets), in {staging_s:.1f} s (median; {partitions} partitions of binaryFile)")


if __name__ == "__main__":
    main()
