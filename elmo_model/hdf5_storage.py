"""What an HDF5 file read from an untrusted source must hold in itself (h5py only, no torch)."""

from __future__ import annotations

import h5py


def require_stored_here(handle: h5py.File, key: str, name: str, error: type[Exception]) -> None:
    """``error`` unless dataset ``key`` (if present) and every group on its path are stored in the
    file itself: HDF5 external and soft links, external raw storage and virtual datasets would take
    values from other files, which the file's hash does not cover."""
    node = handle
    for part in key.split("/"):
        link = node.get(part, getlink=True)
        if link is None:
            return  # missing: the caller says so
        if not isinstance(link, h5py.HardLink):
            raise error(
                f"{name}: '{key}' is reached through an HDF5 {type(link).__name__}; the weights must be stored "
                "in the file itself"
            )
        node = node[part]
    if isinstance(node, h5py.Dataset) and (node.external or node.is_virtual):
        where = "external raw storage" if node.external else "a virtual dataset"
        raise error(
            f"{name}: dataset '{key}' keeps its values in {where}; the weights must be stored in the file itself"
        )
