"""SGLang adapter for SAGE (``--speculative-algorithm sage``); registration lives here."""
