"""Bundled evaluation data: the prompt sets (MT-Bench, GSM8K, HumanEval, VLM image prompts) and how they are rendered.

Used by the bench, the VLM adapters and the draft trainer (which keeps the evaluation prompts out of its training
data); the files and their licences ship in the demo distribution (``demo/sage_plugin_demo/data``, ``SOURCES.md``).
"""
