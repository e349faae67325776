"""Train a CNN on PNG or JPEG files read with Spark's binaryFile source, decoded on the executors.

Run with spark-submit::

    spark-submit --master 'local[2]' jobs/train_images.py --output-dir output/digits-images

The images are what users keep: one encoded file per example in a folder per
class (``<images>/<label>/<name>.png``), read with
``spark.read.format("binaryFile")`` and labelled from the path. Without
``--images`` the job first writes scikit-learn's bundled digits (1,797 8×8
images; nothing downloaded) as PNG (or ``--encoding jpeg``) files with
TensorFlow's encoders into a temporary folder (removed at the end). The bytes are staged as
they came; the preprocessing function :func:`decode` runs on the executors:
it decodes each minibatch with ``sparkdl_avg.decode_images`` and, in
training, shifts every image by up to one pixel at random, seeded per example (so a
re-run gives bitwise the same model). It holds out 20% of the files, trains
with :class:`ParameterAveragingTrainer`, evaluates and predicts through the
same function, and writes ``model.keras``, ``metrics.json`` (history,
held-out metrics, staged bytes against the files' bytes), ``stats.json``
and ``report.html`` to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    from sparkdl_avg.cli import ArgumentParser  # a bad flag: one line, not the usage

    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="output/digits-images", help="where the model and reports go")
    p.add_argument("--images", default=None, metavar="DIR",
                   help="a folder of <label>/<name>.png|jpg files (local or any URI Spark reads); default: "
                        "scikit-learn's digits written to a temporary folder")
    p.add_argument("--encoding", choices=("png", "jpeg"), default="png", help="how to write the digits (default png)")
    p.add_argument("--epochs", type=int, default=15, help="passes over the training files (default 15)")
    p.add_argument("--num-workers", type=int, default=None, help="replicas per round (default: defaultParallelism)")
    p.add_argument("--batch-size", type=int, default=32, help="examples per minibatch per worker (default 32)")
    p.add_argument("--averaging-frequency", type=int, default=8, help="minibatches between averagings (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the weights, the order and the shifts")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output-dir")
    return p.parse_args(argv)


def write_digits(directory: str, encoding: str) -> int:
    """Writes scikit-learn's digits as ``directory/<label>/<index>.<png|jpg>``; returns how many."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.round(digits.images * (255 / 16)).astype(np.uint8)[..., None]
    for i, (image, label) in enumerate(zip(pixels, digits.target)):
        folder = os.path.join(directory, str(label))
        os.makedirs(folder, exist_ok=True)
        data = tf.io.encode_png(image) if encoding == "png" else tf.io.encode_jpeg(image, quality=95)
        with open(os.path.join(folder, f"{i:04d}.{'png' if encoding == 'png' else 'jpg'}"), "wb") as f:
            f.write(data.numpy())
    return len(pixels)


def decode(batch, seeds=None, training=False):
    """The preprocessing function: PNG/JPEG bytes → 8×8×1 float32 images in [0, 1], shifted at random in training.

    ``decode_images`` decodes the minibatch in one TensorFlow call; each example's shift comes from its seed
    (a uniform 63-bit integer derived from the fit's seed, the epoch and the example), so a re-run, a retried
    task and a resumed fit shift every image the same way.
    """
    from sparkdl_avg import decode_images

    images = decode_images(batch["content"], channels=1).astype("float32") / 255.0
    if training:
        for i, seed in enumerate(seeds):
            images[i] = np.roll(images[i], (int(seed % 3) - 1, int(seed // 3 % 3) - 1), axis=(0, 1))
    return {"image": images}


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("py4j").setLevel(logging.WARNING)
    log = logging.getLogger("train_images")

    from sparkdl_avg import ParameterAveragingTrainer
    from sparkdl_avg.cli import spark_session
    from sparkdl_avg.shared.files import fs
    from train_digits import build_model  # the CNN of make train: 8×8×1 images, 10 classes

    out = fs.OutputDir(args.output_dir, overwrite=args.overwrite)
    out.check()  # before any work: refuses an existing or unwritable --output-dir
    images, made = args.images, None
    if images is None:
        import tempfile

        images = made = tempfile.mkdtemp(prefix="sparkdl_avg-digits-")
        log.info("wrote %d digits as %s files under %s", write_digits(images, args.encoding), args.encoding, images)

    spark = spark_session("sparkdl_avg train_images")
    spark.sparkContext.setLogLevel("WARN")
    try:
        from pyspark.sql import functions as F

        files = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(images)
                 .withColumn("label", F.regexp_extract("path", r"/(\d+)/[^/]+$", 1).cast("int")))
        train_df, test_df = files.randomSplit([0.8, 0.2], seed=args.seed)
        model = build_model(args.seed)
        with ParameterAveragingTrainer(model, num_workers=args.num_workers, batch_size=args.batch_size,
                                       averaging_frequency=args.averaging_frequency, seed=args.seed,
                                       preprocess=decode, slow_warning=False) as trainer:
            history = trainer.fit(train_df, features_col="image", label_col="label", epochs=args.epochs,
                                  validation_data=test_df, verbose=2)
            test = trainer.evaluate(test_df, features_col="image", label_col="label", return_dict=True)
            predictions = trainer.predict(test_df, features_col="image").select("label", "prediction").toArrow()
            summary = trainer.stats.summary()
            trainer.write_report(out.file("report.html"), title="sparkdl_avg: a CNN on PNG/JPEG files")
            sizes = train_df.agg(F.sum(F.length("content")), F.sum(F.length("path")), F.count("*")).first()
            file_bytes, path_bytes, rows = (int(v) for v in sizes)
        agreement = float(np.mean(predictions.column("label").to_numpy()
                                  == predictions.column("prediction").to_numpy()))
        print(f"Held-out test accuracy: {test['accuracy']:.4f} (loss {test['loss']:.4f}); predict agrees on "
              f"{agreement:.4f}")
        extra = summary["staged_bytes"] - file_bytes - path_bytes
        print(f"Staged {summary['staged_bytes']} bytes: the {file_bytes} bytes of {rows} PNG/JPEG files as they came, "
              f"their paths ({path_bytes} bytes, to name a file that fails to decode) and {extra} bytes of labels "
              "and offsets")
        model.save(out.file("model.keras"))
        trainer.stats.to_json(out.file("stats.json"))
        out.write_json("metrics.json", {"test": test, "predict_accuracy": agreement, "history": history.history,
                                        "summary": summary, "file_bytes": file_bytes, "path_bytes": path_bytes,
                                        "rows": rows})
        out.commit(keep_on_error=True)  # the trained model is not lost: the error says where it is
    finally:
        out.cleanup()
        spark.stop()
        if made is not None:
            import shutil

            shutil.rmtree(made, ignore_errors=True)
    print(f"Saved model.keras, stats.json, metrics.json and report.html to {args.output_dir}")
    return 0


if __name__ == "__main__":
    from sparkdl_avg.cli import run

    sys.exit(run(main))
