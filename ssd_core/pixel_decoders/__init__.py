"""Pixel decoders: token grids -> images, for the models whose transformers class has none.

chameleon_vqgan.py: Meta's Chameleon VQGAN decoder (Lumina-mGPT's pixels); convert_vqgan.py turns the
released vqgan.ckpt into the safetensors file it reads. reference_vq.py: the bundled reference model's VQ.
"""
