"""`phalanx image build`: the operator and worker images, built with buildah from a Debian base made locally.

No registry is needed: the base comes from the machine's own Debian mirror (mmdebstrap), the Dockerfile's
targets build on it, and the images are saved as docker-archive tars (and imported into a running containerd).
"""
