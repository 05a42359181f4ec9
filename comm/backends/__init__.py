"""zerocomm package."""
