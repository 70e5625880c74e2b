"""Where a client shard's secret comes from: made inside the shard, never handed to Ray.

The secret keys every coin the shard's clients flip (:func:`rknn_ray.rng.derived_generator`)
and their report ids; whoever holds it can recompute those coins and undo local
randomization. So the driver never makes it: an actor argument is kept by Ray's GCS (for
restarts) and passes through the driver, the raylet and the object store. The driver hands
each shard a :class:`ShardKeyStore` instead -- public names only (a folder, the job id) --
and the shard looks its secret up there, or creates it from the OS CSPRNG:

    <root>/<job id>/shard-<i>.key      root and job folders 0700, the key 0600, owner only

The store is on the shard's own node: a restarted shard on the same node reads the same
secret and re-sends the same reports. A restarted shard that finds no secret (it came back
on another node, or the file was deleted) refuses to start rather than draw fresh coins,
which would randomize its clients' records twice. :meth:`ShardKeyStore.forget` deletes
a shard's secret when the job's protocol session closes.

``run.rng: seeded`` derives the secret from ``run.seed`` inside the shard
(:class:`SeededShardSecrets`): reproducible and NOT PRIVATE, as the report says.
"""
from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass

from rknn_ray.errors import RknnError
from rknn_ray.rng import derived_key, new_client_secret

SECRET_LEN = 32


class ShardSecretError(RknnError):
    """A shard cannot get its secret safely (a lost secret, or a key store others can read)."""


def default_root() -> str:
    """The node-local default: ``$TMPDIR/rknn-ray-keys-<uid>`` as the shard's node sees it."""
    return os.path.join(tempfile.gettempdir(), f"rknn-ray-keys-{os.getuid()}")


def _private_dir(path: str, what: str) -> None:
    """Create ``path`` as an owner-only folder, or check that the existing one is one."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    _check_private(path, what)


def check_key_store(root: str | None) -> None:
    """The driver's early look at the key store on its own node (a local instance): one that
    exists must be an owner-only folder, so the job is refused in one line before Ray starts,
    not by each shard through Ray's frames. A missing one is made by the first shard."""
    path = root or default_root()
    if os.path.lexists(path):
        _check_private(path, "key store")


def _check_private(path: str, what: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ShardSecretError(f"the {what} {path} is not a folder (a link or a file). Fix: "
                               "remove it, or set cluster.key_store to another folder")
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ShardSecretError(
            f"the {what} {path} is owned by uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):o}; shard secrets need a folder only uid {os.getuid()} "
            f"can open. Fix: chmod 700 {path} (if it is yours), or set cluster.key_store to a "
            "private folder")


@dataclass(frozen=True)
class ShardKeyStore:
    """A node-local, owner-only folder of shard secrets for one job (see module docstring).

    ``root`` None means :func:`default_root` on the shard's node. Only public names travel
    through Ray in this object; the secret itself is read and written by the shard.
    """
    job_id: str
    root: str | None = None

    def folder(self) -> str:
        return os.path.join(self.root or default_root(), self.job_id)

    def path(self, shard_id: int) -> str:
        return os.path.join(self.folder(), f"shard-{int(shard_id)}.key")

    def secret(self, shard_id: int, restarted: bool = False) -> bytes:
        """The shard's secret: the stored one, else (first start only) a new one, stored."""
        root = self.root or default_root()
        if self.root:
            os.makedirs(os.path.dirname(os.path.abspath(root)), exist_ok=True)
        _private_dir(root, "key store")
        _private_dir(self.folder(), "key store folder")
        path = self.path(shard_id)
        found = self._read(path)
        if found is not None:
            return found
        if restarted:
            raise ShardSecretError(
                f"client shard {shard_id} was restarted but its secret {path} is gone (a restart "
                "on another node, or a deleted file); a new secret would randomize its clients' "
                "records a second time. Nothing of this shard was re-sent. Fix: keep a shard on "
                "its node (cluster.key_store on a node-local disk) and run the job again")
        return self._create(path)

    def forget(self, shard_id: int) -> bool:
        """Delete the shard's secret (and the job folder once empty); True if one was deleted."""
        try:
            os.unlink(self.path(shard_id))
        except FileNotFoundError:
            return False
        try:
            os.rmdir(self.folder())
        except OSError:               # other shards' secrets are still there
            pass
        return True

    @staticmethod
    def _read(path: str) -> bytes | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            data = fh.read(SECRET_LEN + 1)
        if st.st_uid != os.getuid() or st.st_mode & 0o077 or len(data) != SECRET_LEN:
            raise ShardSecretError(
                f"the shard secret {path} is not a {SECRET_LEN}-byte file only uid "
                f"{os.getuid()} can read (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}, "
                f"{len(data)} bytes). Fix: delete that job's folder {os.path.dirname(path)} "
                "and run the job again")
        return data

    def _create(self, path: str) -> bytes:
        """Write a fresh secret to a 0600 temp file, fsync, then link it into place.

        The link fails if another incarnation got there first (then its secret wins), so a
        reader never sees a half-written key and two secrets never both go out.
        """
        secret = new_client_secret()
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))   # mode 0600
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(secret)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                return self._read(path)
            dfd = os.open(os.path.dirname(path), os.O_RDONLY)
            try:
                os.fsync(dfd)             # the name survives a crash of the node
            finally:
                os.close(dfd)
            return secret
        finally:
            os.unlink(tmp)


@dataclass(frozen=True)
class SeededShardSecrets:
    """``run.rng: seeded``: the secret follows from ``run.seed`` (NOT PRIVATE, reproducible)."""
    seed: int

    def secret(self, shard_id: int, restarted: bool = False) -> bytes:
        return derived_key(str(self.seed).encode(), "shard", int(shard_id))

    def forget(self, shard_id: int) -> bool:
        return False
