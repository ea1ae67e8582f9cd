"""sage-plugin: SAGE entropy-guided adaptive speculative decoding (arXiv 2602.00523).

The public API is runtime-free: :class:`~sage_plugin.config.SageConfig` and the core
(:mod:`sage_plugin.core`).  Runtimes (the reference engine, SGLang) are imported on demand.
"""

from .config import ConfigError, SageConfig

__all__ = ["ConfigError", "SageConfig", "__version__"]
__version__ = "0.1.0"
