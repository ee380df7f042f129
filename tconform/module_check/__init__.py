"""Check your own PyTorch module: export it (or take an ONNX file made elsewhere), run it on the
requested runtimes and providers, judge every output against the module's own float64 copy,
and name the first submodule that diverges (docs/check.md).

    report = tconform.check(module, example_inputs)   # -> Report; report.exit_code as the CLI
"""

from tconform.localise import Localisation
from tconform.module_check.run import Report, check

__all__ = ["Localisation", "Report", "check"]
