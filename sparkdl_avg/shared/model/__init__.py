"""The model's travel: a compiled Keras model described for executors (:mod:`.modelspec`), custom objects, GPU pinning and TensorFlow's quiet import."""
