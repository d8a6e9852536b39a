"""The embedding cache: :class:`EmbeddingCache` reads and writes one entry per caption.

Writes go to a temp file in the entry's folder, are fsynced and renamed over the entry with
:func:`os.replace`, so readers and concurrent writers (threads or processes writing the same key)
only ever see complete files. There is no index. On read, a file whose header, tensor set, metadata
or digest does not match is reported once (logger ``te_align``), counted in
:attr:`EmbeddingCache.stats`, deleted, and treated as a miss.

No torch at import.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from te_align._atomic import atomic_file
from te_align._safetensors import SafetensorsError, parse_header
from te_align.encoding.cache.admin import CacheInfo, clear, scan
from te_align.encoding.cache.keys import (
    CACHE_FORMAT,
    FORMAT_VERSION,
    REQUIRED_META,
    cache_key,
    canonical_options,
    entry_path,
    hash_text_encoders,
    sha256_text,
    tensors_digest,
    write_marker,
)
from te_align.encoding.conditioning import Conditioning
from te_align.errors import CacheError, TeAlignError
from te_align.profiles import profile as resolve

if TYPE_CHECKING:  # pragma: no cover
    from te_align.profiles import AlignmentProfile

# Function-local te_align imports in this module: load what only one command needs when it runs.

logger = logging.getLogger("te_align")


@dataclass
class CacheStats:
    """Counts for one :class:`EmbeddingCache` object (corrupt entries also count as misses)."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    written: int = 0


class _Corrupt(Exception):
    pass


def _why(e: OSError) -> str:
    """A write failure in words, with what to do."""
    import errno

    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the device: free space on that disk (or clear old entries: te-align cache clear DIR)"
    if e.errno == errno.EFBIG:
        return "file too large (a file-size limit, ulimit -f): raise the limit or free space"
    if e.errno == errno.EROFS:
        return "read-only file system: use a writable cache folder"
    return e.strerror or str(e)


# ------------------------------------------------------------------------------------- cache
class EmbeddingCache:
    """Per-caption conditioning on disk for one profile, one set of text-encoder weights and one set of options.

    ``profile`` is an :class:`AlignmentProfile` or anything :func:`te_align.profile` resolves;
    ``text_encoders_hash`` is :func:`hash_text_encoders` of the loaded encoders (or any string that
    identifies their weights, e.g. file checksums; a dict of modules is hashed for you);
    ``options`` are the encoding options that change the result (chunking, max chunks, dropout
    policy, …), JSON-serialisable. ``verify=False`` skips the tensor digest check on reads.

    Returned conditionings are CPU tensors exactly as stored, so a hit and a miss give identical
    results; move them with :meth:`Conditioning.to`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        profile: AlignmentProfile | str,
        text_encoders_hash: str | Mapping[str, Any],
        options: Mapping[str, Any] | None = None,
        *,
        verify: bool = True,
    ) -> None:
        self.directory = Path(directory)
        self.profile = resolve(profile)
        self.fingerprint = self.profile.fingerprint()
        self.text_encoders_hash = hash_text_encoders(text_encoders_hash)
        self.options = dict(options or {})
        self.options_json = canonical_options(self.options)
        #: Profile values the user overrode (recorded in each entry, so ``cache info`` can tell an
        #: overridden profile from a stale one).
        self.overrides = sorted(path for path, pv in self.profile.provenance if pv.status == "override")
        self.verify = verify
        self.stats = CacheStats()
        if self.directory.exists() and not self.directory.is_dir():
            raise CacheError("cache path exists and is not a folder", file=str(self.directory))
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_marker(self.directory)
        except OSError as e:
            raise CacheError(f"cannot use as a cache folder: {_why(e)}", file=str(self.directory)) from None

    def __repr__(self) -> str:
        return f"EmbeddingCache({str(self.directory)!r}, {self.profile.name} {self.fingerprint}, options={self.options_json})"

    # ----------------------------------------------------------------- keys
    def key(self, caption: str) -> str:
        return cache_key(self.fingerprint, self.text_encoders_hash, caption, self.options_json)

    def path(self, caption: str) -> Path:
        return self._path(self.key(caption))

    def _path(self, key: str) -> Path:
        return entry_path(self.directory, key)

    # -------------------------------------------------------------- reading
    def get(self, caption: str) -> Conditioning | None:
        """The cached conditioning of ``caption`` (batch of one), or None on a miss."""
        key = self.key(caption)
        cond = self._load(key, caption)
        if cond is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return cond

    def __contains__(self, caption: object) -> bool:
        return isinstance(caption, str) and self._path(self.key(caption)).is_file()

    def _load(self, key: str, caption: str) -> Conditioning | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CacheError(f"cannot read cache entry: {e.strerror}", file=str(path)) from None
        try:
            return self._decode(data, path, key, caption)
        except _Corrupt as e:
            self._discard(path, st, str(e))
            return None

    def _decode(self, data: bytes, path: Path, key: str, caption: str) -> Conditioning:
        try:
            head = parse_header(data, len(data), label=str(path))
        except SafetensorsError as e:
            raise _Corrupt(e.message) from None
        except RecursionError:
            raise _Corrupt("the header JSON is nested too deeply") from None
        meta = head.metadata
        missing = [k for k in REQUIRED_META if k not in meta]
        if missing:
            raise _Corrupt(f"metadata lacks {', '.join(missing)}")
        expected = {
            "te_align.format": CACHE_FORMAT,
            "te_align.format_version": str(FORMAT_VERSION),
            "te_align.key": key,
            "te_align.fingerprint": self.fingerprint,
            "te_align.text_encoders": self.text_encoders_hash,
            "te_align.caption_sha256": sha256_text(caption),
            "te_align.options": self.options_json,
        }
        for k, want in expected.items():
            if meta[k] != want:
                raise _Corrupt(f"metadata {k} is {meta[k][:80]!r}, expected {want[:80]!r}")
        try:
            names = json.loads(meta["te_align.tensor_names"])
            counts = json.loads(meta.get("te_align.token_counts", "null"))
            shared = json.loads(meta.get("te_align.shared", "[]"))
            batch_dims = json.loads(meta.get("te_align.batch_dims", "{}"))
        except json.JSONDecodeError as e:
            raise _Corrupt(f"metadata is not valid JSON ({e.msg})") from None
        except RecursionError:
            raise _Corrupt("metadata JSON is nested too deeply") from None
        if not isinstance(names, list) or sorted(names) != sorted(head.tensors) or len(set(names)) != len(names):
            raise _Corrupt(f"tensor set {sorted(head.tensors)} does not match the recorded {names}")
        if counts is not None and not (isinstance(counts, list) and all(isinstance(n, int) for n in counts)):
            raise _Corrupt("metadata te_align.token_counts is not a list of integers")
        if not isinstance(shared, list):
            raise _Corrupt("metadata te_align.shared is not a list")
        if not (isinstance(batch_dims, dict) and all(isinstance(d, int) for d in batch_dims.values())):
            raise _Corrupt("metadata te_align.batch_dims is not a table of integers")
        try:
            from safetensors.torch import load

            loaded = load(data)
        except Exception as e:  # the library's own error types vary by version
            raise _Corrupt(f"safetensors cannot load it ({e})") from None
        tensors = {n: loaded[n] for n in names}
        if self.verify and tensors_digest(tensors) != meta["te_align.tensors_sha256"]:
            raise _Corrupt("tensor bytes do not match their recorded digest")
        return Conditioning(tensors, self.profile.name, self.fingerprint, counts, tuple(shared), tuple(batch_dims.items()))

    def _discard(self, path: Path, st: os.stat_result, reason: str) -> None:
        """Delete a corrupt entry (unless a writer replaced it since we read it) and report it once."""
        self.stats.corrupt += 1
        try:
            now = os.stat(path)
            if (now.st_ino, now.st_dev, now.st_mtime_ns, now.st_size) == (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size):
                path.unlink()
        except FileNotFoundError:
            pass
        logger.warning("te-align cache: corrupt entry %s (%s); deleted, will re-encode", path, reason)

    # -------------------------------------------------------------- writing
    def put(self, caption: str, conditioning: Conditioning) -> Path:
        """Store the conditioning (batch of one) of ``caption``; returns the entry's path."""
        key = self.key(caption)
        self._store(key, caption, self._prepare(conditioning))
        return self._path(key)

    def _prepare(self, cond: Conditioning) -> Conditioning:
        if not isinstance(cond, Conditioning):
            raise CacheError(f"expected a Conditioning, got {type(cond).__name__}")
        if cond.fingerprint != self.fingerprint:
            raise CacheError(
                f"conditioning was encoded by {cond.profile_name} ({cond.fingerprint}), "
                f"but this cache is for {self.profile.name} ({self.fingerprint})"
            )
        if cond.batch_size != 1:
            raise CacheError(f"cache entries hold one caption; got a batch of {cond.batch_size} (use .index(i))")
        if not cond.tensors:
            raise CacheError("conditioning has no tensors")
        tensors = {k: t.detach().to("cpu").contiguous().clone() for k, t in cond.tensors.items()}
        return Conditioning(tensors, self.profile.name, self.fingerprint, cond.token_counts, cond.shared, cond.batch_dims)

    def _store(self, key: str, caption: str, cond: Conditioning) -> None:
        from safetensors.torch import save

        meta = {
            "te_align.format": CACHE_FORMAT,
            "te_align.format_version": str(FORMAT_VERSION),
            "te_align.key": key,
            "te_align.profile": self.profile.name,
            "te_align.fingerprint": self.fingerprint,
            "te_align.text_encoders": self.text_encoders_hash,
            "te_align.caption_sha256": sha256_text(caption),
            "te_align.options": self.options_json,
            "te_align.tensor_names": json.dumps(list(cond.tensors)),
            "te_align.tensors_sha256": tensors_digest(cond.tensors),
            "te_align.token_counts": json.dumps(cond.token_counts),
            "te_align.shared": json.dumps([s for s in cond.shared if s in cond.tensors]),
            "te_align.batch_dims": json.dumps({k: d for k, d in cond.batch_dims if k in cond.tensors}),
            "te_align.created": f"{time.time():.3f}",
        }
        if self.overrides:
            meta["te_align.overrides"] = json.dumps(self.overrides)
        blob = save(dict(cond.tensors), metadata=meta)
        path = self._path(key)
        try:
            with atomic_file(path, error=CacheError) as f:
                f.write(blob)
        except OSError as e:  # a full disk or a read-only folder: one line, the entry is simply not stored
            raise CacheError(f"cannot write cache entry: {_why(e)}", file=str(path)) from None
        self.stats.written += 1

    # ------------------------------------------------------------ batches
    def get_or_encode(
        self, captions: Sequence[str], encode_fn: Callable[[list[str]], Conditioning], *, store: bool = True
    ) -> list[Conditioning]:
        """Conditioning for each caption: hits from disk, misses encoded in one ``encode_fn`` call and stored.

        ``encode_fn(missing_captions)`` must return one :class:`Conditioning` with a batch of
        ``len(missing_captions)`` (each distinct missing caption once, in first-seen order). The
        result is one batch-of-one conditioning per input caption, in input order. ``store=False``
        reads the cache but writes nothing (e.g. the non-main processes of a data-parallel run).
        """
        if isinstance(captions, str):
            raise CacheError("get_or_encode takes a list of captions, not one string")
        captions = list(captions)
        found: dict[str, Conditioning] = {}
        missing: dict[str, None] = {}  # ordered set
        for c in captions:
            if c in found or c in missing:
                continue
            hit = self.get(c)
            if hit is None:
                missing[c] = None
            else:
                found[c] = hit
        if missing:
            batch = encode_fn(list(missing))
            if not isinstance(batch, Conditioning):
                raise CacheError(f"encode_fn returned {type(batch).__name__}, expected a Conditioning")
            if batch.batch_size != len(missing):
                raise CacheError(f"encode_fn returned a batch of {batch.batch_size} for {len(missing)} captions")
            for i, c in enumerate(missing):
                single = self._prepare(batch.index(i))
                if store:
                    self._store(self.key(c), c, single)
                found[c] = single
        return [found[c] for c in captions]

    # -------------------------------------------------------------- admin
    def info(self) -> CacheInfo:
        """What the whole folder holds (all profiles), from entry headers."""
        return scan(self.directory)

    def clear(self, profile_name: str | None = None) -> int:
        """Delete every entry in the folder, or only those recorded for ``profile_name``.

        A name is matched against each entry's recorded profile name, and — when it resolves to a
        profile — that profile's fingerprint. Returns the number of entries deleted.
        """
        if profile_name is None:
            return clear(self.directory).removed
        names, fps = [profile_name], []
        try:
            from te_align.profiles import profile as resolve

            p = resolve(profile_name)
            names.append(p.name)
            fps.append(p.fingerprint())
        except TeAlignError:  # an unresolvable name still matches entries by recorded name
            pass
        return clear(self.directory, profile_names=names, fingerprints=fps).removed


__all__ = ["CacheStats", "EmbeddingCache"]
