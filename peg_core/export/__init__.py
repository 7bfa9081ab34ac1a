"""Deployment of any model of the suite, model-agnostic; opt-in (``import peg_core`` does not load it).

* :mod:`peg_core.export.onnx`: the ONNX exporter of every ``export`` command (dynamo export
  with metadata, the onnxruntime check; :class:`~peg_core.export.onnx.ExportError` for a bad input);
* :mod:`peg_core.export.cli`: the ``export`` commands' flags (``--opset``, ``--check``) and
  output check, the one module here of the command line's layer;
* :mod:`peg_core.export.quantize`: int8 post-training quantization with PT2E (torchao).

The submodules are imported by name (``from peg_core.export.onnx import export_onnx``):
each brings its own optional dependencies (onnx / onnxruntime, torchao) only when used.
Models are exported as they are: they take the export-safe resize path themselves
(:func:`peg_core.resize.is_tracing`); nothing is patched at run time.
"""
