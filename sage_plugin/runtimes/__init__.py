"""Runtime adapters that plug SAGE into serving engines (SGLang first)."""
