"""Listing a bucket's keys in sorted pages, as S3's ListObjects and GCS's objects.list both do.

Only the folders a prefix can reach are walked, and a folder that the delimiter folds into one common
prefix is not walked at all (:func:`walk_keys`); :func:`list_page` cuts one page after the last name of
the previous one. Page tokens are that name, base64-encoded.
"""

from __future__ import annotations

import base64
import os
from bisect import bisect_right

from emustore.http import StoreError
from emustore.objects import HIDDEN

__all__ = ["decode_token", "encode_token", "holds_file", "list_page", "walk_keys"]


def walk_keys(top: str, prefix: str, delimiter: str, root_prefix: str) -> list[str]:
    """The sorted keys under folder ``top`` that start with ``prefix``.

    Only folders the prefix can reach are walked. A folder whose keys all share one common prefix
    (the delimiter occurs in its own path past ``prefix``) is not walked: it stands as the pseudo key
    "folder/" (when it holds a file), which :func:`list_page` folds into that common prefix.
    """
    keys: list[str] = []
    stack = [(top, "")]
    while stack:
        folder, rel = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(HIDDEN):
                continue
            key = rel + entry.name
            if entry.is_dir(follow_symlinks=False):
                sub = key + "/"
                if sub.startswith(prefix) and delimiter and delimiter in sub[len(prefix):]:
                    if holds_file(entry.path, root_prefix):
                        keys.append(sub)
                elif sub.startswith(prefix) or prefix.startswith(sub):
                    stack.append((entry.path, sub))
            elif key.startswith(prefix) and _served(entry, root_prefix):
                keys.append(key)
    keys.sort()
    return keys


def list_page(keys: list[str], prefix: str, delimiter: str, after: str,
              limit: int) -> tuple[list[tuple[str, bool]], bool]:
    """One page of a listing: up to ``limit`` (name, is_common_prefix) after ``after``; and whether more follow.

    Keys that hold the delimiter past the prefix fold into their common prefix, listed once. ``after``
    is the last name of the previous page (a key or a common prefix) or a start-after key.
    """
    items: list[tuple[str, bool]] = []
    if limit <= 0:
        return items, False
    previous = after
    for key in keys[bisect_right(keys, after):]:
        name, is_prefix = key, False
        if delimiter:
            cut = key.find(delimiter, len(prefix))
            if cut >= 0:
                name, is_prefix = key[:cut + len(delimiter)], True
                if name == previous:
                    continue
        if len(items) == limit:
            return items, True
        items.append((name, is_prefix))
        previous = name
    return items, False


def holds_file(folder: str, root_prefix: str) -> bool:
    """Whether a folder holds a served file at any depth (so its keys exist)."""
    stack = [folder]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            if entry.name.startswith(HIDDEN):
                continue
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            elif _served(entry, root_prefix):
                return True
    return False


def encode_token(item: str) -> str:
    """The page token that resumes a listing after ``item``."""
    return base64.urlsafe_b64encode(item.encode()).decode()


def decode_token(token: str) -> str:
    """The name a page token resumes after; 400 InvalidArgument for a token this store did not make."""
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (ValueError, UnicodeDecodeError):
        raise StoreError(400, "InvalidArgument", "The continuation token provided is incorrect") from None


def _served(entry: os.DirEntry[str], root_prefix: str) -> bool:
    """Whether a directory entry is a file the store serves (a regular file, or a link to one inside)."""
    if entry.is_file(follow_symlinks=False):
        return True
    if not entry.is_symlink():
        return False
    real = os.path.realpath(entry.path)
    return real.startswith(root_prefix) and os.path.isfile(real)
