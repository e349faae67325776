"""The model's travel: a compiled Keras model described for executors (:mod:`.modelspec`), custom objects, GPU pinning and TensorFlow's quiet import.

Its other modules:

* :mod:`.custom_objects`: importing the modules that define a saved model's custom layers, before Keras loads
  it.
* :mod:`.devices`: which GPUs a task's replica uses: exactly the ones Spark assigned to the task.
* :mod:`.tracing`: what keeps a replica's step function to one trace: every variable of the model's training
  created before it.
"""
