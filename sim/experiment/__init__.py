"""Experiments: validated YAML config (pydantic) -> one resolved engine description -> run or sweep
(local processes or Ray) -> a results folder; offline bounds. Imports every layer below it.
"""
