"""`localspec chat`: a Textual terminal chat that shows speculation working."""
