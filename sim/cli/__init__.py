"""The ``apcsim`` command line (mirrors the ``vllm`` CLI's parse-and-dispatch): parse, call one
experiment function, print (``main``). Invariants: no simulation logic here. Imports neither
torch nor gpu_backend.
"""
