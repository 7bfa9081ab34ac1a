"""Deployment of any model of the suite, model-agnostic; opt-in (``import peg_core`` does not load it).

* :mod:`peg_core.export.onnx`: the ONNX exporter of every ``export`` command (opset flag,
  dynamo export with metadata, the onnxruntime check);
* :mod:`peg_core.export.quantize`: int8 post-training quantization with PT2E (torchao).

The submodules are imported by name (``from peg_core.export.onnx import export_onnx``):
each brings its own optional dependencies (onnx / onnxruntime, torchao) only when used.
Models are exported as they are: they take the export-safe resize path themselves
(:func:`peg_core.resize.is_tracing`); nothing is patched at run time.
"""
