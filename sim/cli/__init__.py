"""The ``apcsim`` command line: parse, call one experiment function, print (``main``)."""
