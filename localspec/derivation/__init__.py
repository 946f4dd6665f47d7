"""GGUF files made from other GGUF files, and what a GGUF says about itself: requantized
targets and drafts (``quantize``), layer-subset drafts for draft-self (``layer_subset``,
``self_draft``), header reading (``gguf_info``)."""
