"""`polytile bench`: measured performance against NumPy and PyTorch, with this machine's peak."""
