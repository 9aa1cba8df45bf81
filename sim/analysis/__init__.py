"""Reading results: sweep plots and reports. Reads result tables; never re-runs the engine."""
