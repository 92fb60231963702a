# Run as root on a host that receives bytes from another host (a model from `model_sources`, a
# donor's venv files): unpack the tar stream on stdin into DEST as root's own files. What the
# archive says of owners is ignored (every file is the unpacker's, root's); modes lose setuid,
# setgid, sticky and group/other write (mode & 0o755). Refused, naming the member (exit 1): device
# nodes, fifos and any other special entry, absolute names and names with `..`, a symlink whose
# target is absolute or leaves the tree, a hard link to anything but a regular file this stream
# already wrote, a member whose path passes through a symlink. Each file is written under a
# temporary name beside it and renamed into place only once whole, so a refused or cut stream leaves
# no half-written file under a real name (the temporary one is removed).
# The checks are this script's own: bookworm's Python 3.11.2 has no tarfile extraction filters.
# Whatever the sender is, the stream is bounded: no sparse member (a few KiB that would write
# gigabytes of holes), no header larger than HEADER_MAX (tarfile reads one whole into memory), at
# most so many members, no member larger than the free space, no pause longer than IDLE_S and no
# stream longer than `--deadline-s`; each named when it stops the stream.
# With `--listing` (what the origin says the files are, `{relpath: [size, sha256 or null]}`, as
# base64 of zlib'd JSON: operations/model/model_digests.py, the wheels' pins): the listed files'
# total must fit the free space before anything is read; a regular file not listed, of another size,
# or whose bytes hash to another sha256 than listed is refused (its temporary file removed, never
# renamed into place); a name sent twice is refused, a symlink unless listed with that target
# (["symlink", target]), a hard link unless to a file this stream wrote with the link's listed
# digest. Directories need no listing.
# Sent as `python3 -I -c SCRIPT DEST [--suffix S] [--listing L] [--deadline-s N]` (stdin is the
# stream, not the script). SUFFIX is appended to every regular file's name.
import argparse
import base64
import hashlib
import io
import json
import os
import signal
import stat
import sys
import tarfile
import time
import zlib

BLOCK = 1 << 20  # file data is copied in 1 MiB blocks (tarfile's own copy uses 16 KiB)
# tarfile reads the stream READ bytes at a time (its default is 10 KiB): a pipe's worth per read(2).
# Reads of several MiB each take fresh pages from the kernel (twice the page faults on a 2 GiB
# stream, for little gain).
READ = 1 << 16
FILE_MODE = 0o755  # no setuid, setgid or sticky bit, no write for group or others
HEADER_MAX = 1 << 16  # a pax or GNU long-name header: a path and a few keys, never more
MEMBERS_MAX = 500_000  # a venv's files are tens of thousands
LISTED_DIRS_MAX = 10_000  # with a listing: at most so many members beyond the listed files
IDLE_S = 300  # the longest pause between two reads of the stream
SYMLINK = "symlink"  # a listing's entry for a link: [SYMLINK, its target]
# members whose content tarfile reads whole, as a header of the next member
HEADER_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)


class Refused(Exception):
    pass


class TimedOut(Exception):
    pass


class BoundedInfo(tarfile.TarInfo):
    """tarfile's member, judged before tarfile reads what its header announces: a pax or GNU
    long-name header is read whole into memory, and an old GNU sparse member expands to holes."""

    def _proc_member(self, archive):
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise Refused(f"a sparse member ({shown(self.name)})")
        if self.type in HEADER_TYPES and self.size > HEADER_MAX:
            raise Refused(f"a header of {self.size} bytes (at most {HEADER_MAX})")
        return super()._proc_member(archive)


class Timed(io.RawIOBase):
    """The stream on stdin, each read bounded: at most IDLE_S without a byte, and nothing read after
    the deadline (a monotonic time, or None)."""

    def __init__(self, fd, deadline, total_s):
        self.fd, self.deadline, self.total_s = fd, deadline, total_s
        signal.signal(signal.SIGALRM, self._alarm)
        self.waiting = ""

    def _alarm(self, signum, frame):
        raise TimedOut(self.waiting)

    def readable(self):
        return True

    def readinto(self, buffer):
        wait, self.waiting = IDLE_S, f"no bytes from the sender for {IDLE_S} s"
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimedOut(f"the stream took longer than {self.total_s} s")
            if left < wait:
                wait, self.waiting = left, f"the stream took longer than {self.total_s} s"
        signal.setitimer(signal.ITIMER_REAL, wait)
        try:
            return os.readv(self.fd, [buffer])
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def shown(name):
    return name if name.isprintable() else ascii(name)


def parts_of(name, what="name"):
    """A member's path as its components; refused when absolute or with a `..` component."""
    if name.startswith("/"):
        raise Refused(f"an absolute {what}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise Refused(f"a {what} with '..'")
    return parts


class Unpacker:
    def __init__(self, dest, suffix="", listing=None):
        self.dest = dest
        # appended to every regular file's name (a wheel from another host lands as NAME.part)
        self.suffix = suffix
        # {relpath: [size, sha256 or None]}: what the origin says the files are; None: no listing
        self.listing = listing
        self.digests = {}  # relpath -> sha256 of each regular file this stream wrote (a listing's)
        self.members = 0
        self.max_members = (MEMBERS_MAX if listing is None
                            else len(listing) + LISTED_DIRS_MAX)
        # relative paths known to be real directories (created here, or found as such)
        self.dirs = set()
        # regular files this stream wrote: the only targets a hard link may have
        self.written = set()
        self.dir_times = {}  # directory -> (mode, mtime), set once everything is in
        self.temporary = None
        self.count = 0

    def parent(self, parts, create=True):
        """The directory that holds `parts`; every component up to it a real directory, made when
        missing."""
        path = self.dest
        for i, name in enumerate(parts[:-1]):
            path = os.path.join(path, name)
            rel = "/".join(parts[: i + 1])
            if rel in self.dirs:
                continue
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                if not create:
                    raise Refused(f"{rel} is not in the tree") from None
                os.mkdir(path, 0o755)
                os.chmod(path, 0o755)
            else:
                if not stat.S_ISDIR(st.st_mode):
                    raise Refused(f"its path passes through {rel}, which is not a directory (a "
                                  "symlink or a file)")
            self.dirs.add(rel)
        return path

    def temp_in(self, directory):
        """A new name beside the member's, for what is written until it is whole (`made` once it
        exists)."""
        self.count += 1
        return os.path.join(directory, f".untar-{os.getpid()}-{self.count}.partial")

    def made(self, temporary):
        self.temporary = temporary  # removed if the stream stops before it is renamed into place

    def put(self, temporary, final, rel):
        """Rename a finished temporary file over its final name (never into a directory that is
        there)."""
        try:
            st = os.lstat(final)
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(st.st_mode):
                raise Refused(f"{rel} is a directory already")
        os.rename(temporary, final)
        self.temporary = None
        self.dirs.discard(rel)

    def member(self, archive, member):
        self.members += 1
        if self.members > self.max_members:
            raise Refused(f"more than {self.max_members} members")
        if member.issparse():
            raise Refused("a sparse member")
        parts = parts_of(member.name)
        if not parts:  # the tree's own root ("." or "./"): DEST stays as its caller made it
            if member.isdir():
                return
            raise Refused("no name")
        rel = "/".join(parts)
        if self.suffix and not (member.isreg() or member.isdir()):
            raise Refused(f"a link in a stream whose files land as NAME{self.suffix}")
        if member.isdir():
            path = self.parent(parts + [""])  # DEST/rel itself, created or checked like a parent
            # set last: a 0o555 one still takes its files
            self.dir_times[path] = (member.mode & FILE_MODE, member.mtime)
        elif member.isreg():
            self.file(archive, member, parts, rel)
        elif member.issym():
            self.symlink(member, parts, rel)
        elif member.islnk():
            self.hardlink(member, parts, rel)
        else:
            kind = {tarfile.CHRTYPE: "a character device", tarfile.BLKTYPE: "a block device",
                    tarfile.FIFOTYPE: "a fifo"}
            raise Refused(kind.get(member.type, f"an entry of type {member.type!r}"))

    def listed(self, rel, size=None):
        """The sha256 the listing holds for a regular file at `rel` (None: no digest listed, or no
        listing); refused where the listing has no such file, or, given `size`, not that size."""
        if rel in self.written:
            raise Refused("a name sent twice")
        if self.listing is None:
            return None
        if rel not in self.listing:
            raise Refused("not in the origin's listing")
        want_size, want_sha = self.listing[rel]
        if want_size == SYMLINK:
            raise Refused(f"a file where the origin has a symlink to {shown(want_sha)}")
        if size is not None and size != want_size:
            raise Refused(f"{size} bytes, the origin's file has {want_size}")
        return want_sha

    def room(self, directory, size):
        free = free_bytes(directory)
        if free is not None and size > free:
            raise Refused(f"{size} bytes, more than the {free} free on its filesystem")

    def file(self, archive, member, parts, rel):
        want_sha = self.listed(rel, member.size)
        directory = self.parent(parts)
        self.room(directory, member.size)
        sha = hashlib.sha256() if self.listing is not None else None
        temporary = self.temp_in(directory)
        fd = os.open(temporary,
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.made(temporary)
        try:
            source = archive.extractfile(member).raw  # tarfile's reader under its 8 KiB buffer
            left = member.size
            while left:
                # raises tarfile.ReadError when the stream ends early
                block = source.read(min(BLOCK, left))
                if not block:
                    raise tarfile.ReadError("unexpected end of data")
                if sha is not None:
                    sha.update(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
                left -= len(block)
            if sha is not None and want_sha is not None and sha.hexdigest() != want_sha:
                raise Refused(f"its bytes differ from the origin's (sha256 {sha.hexdigest()}, "
                              f"the origin's {want_sha})")
            os.fchmod(fd, member.mode & FILE_MODE)
            try:
                os.utime(fd, (member.mtime, member.mtime))
            except (OverflowError, ValueError, OSError):
                pass
        finally:
            os.close(fd)
        self.put(temporary, os.path.join(directory, parts[-1] + self.suffix), rel + self.suffix)
        self.written.add(rel)
        if sha is not None:
            self.digests[rel] = sha.hexdigest()

    def symlink(self, member, parts, rel):
        target = member.linkname
        if not target:
            raise Refused("a symlink with no target")
        if target.startswith("/"):
            raise Refused(f"a symlink to {shown(target)} (absolute)")
        names = [p for p in target.split("/") if p not in ("", ".")]
        ups = next((i for i, p in enumerate(names) if p != ".."), len(names))
        # Up through the link's own directories (real ones: checked), then only down: never out of
        # the tree, whatever other links in it turn out to be.
        if ".." in names[ups:]:
            raise Refused(f"a symlink to {shown(target)} ('..' after a name)")
        if ups > len(parts) - 1:
            raise Refused(f"a symlink to {shown(target)}, out of the tree")
        if self.listing is not None:
            if rel in self.written:
                raise Refused("a name sent twice")
            if self.listing.get(rel) != [SYMLINK, target]:
                raise Refused(f"a symlink to {shown(target)}, which the origin does not list")
        directory = self.parent(parts)
        temporary = self.temp_in(directory)
        os.symlink(target, temporary)
        self.made(temporary)
        self.put(temporary, os.path.join(directory, parts[-1]), rel)
        self.written.discard(rel)

    def hardlink(self, member, parts, rel):
        target = member.linkname
        try:
            names = parts_of(target, "target")
        except Refused as refused:
            raise Refused(f"a hard link to {shown(target)}: {refused}") from None
        source = os.path.join(self.parent(names, create=False), names[-1]) if names else self.dest
        if "/".join(names) not in self.written or not stat.S_ISREG(os.lstat(source).st_mode):
            raise Refused(
                f"a hard link to {shown(target)}, not a regular file this archive wrote before it")
        if self.listing is not None:
            want_sha = self.listed(rel)  # its bytes are its target's: held to the digest below
            if want_sha is not None and self.digests.get("/".join(names)) != want_sha:
                raise Refused(f"a hard link to {shown(target)}, whose bytes are not the origin's "
                              f"file {shown(rel)}")
        directory = self.parent(parts)
        temporary = self.temp_in(directory)
        os.link(source, temporary, follow_symlinks=False)
        self.made(temporary)
        self.put(temporary, os.path.join(directory, parts[-1]), rel)
        self.written.add(rel)
        if "/".join(names) in self.digests:
            self.digests[rel] = self.digests["/".join(names)]

    def finish(self):
        for path, (mode, mtime) in sorted(self.dir_times.items(), reverse=True):
            os.chmod(path, mode)
            try:
                os.utime(path, (mtime, mtime))
            except (OverflowError, ValueError, OSError):
                pass

    def drop_temporary(self):
        if self.temporary is not None:
            try:
                os.unlink(self.temporary)
            except OSError:
                pass


def free_bytes(path):
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def read_listing(text):
    """`--listing`'s value: {relpath: [size, sha256 or None]}, or exit naming what is wrong."""
    try:
        listing = json.loads(zlib.decompress(base64.b64decode(text)).decode("utf-8"))
        assert isinstance(listing, dict) and all(
            isinstance(v, list) and len(v) == 2 and (v[1] is None or isinstance(v[1], str))
            and (v[0] == SYMLINK or (isinstance(v[0], int) and v[0] >= 0))
            for v in listing.values())
    except Exception:
        sys.exit("untar: --listing is not a listing")
    return listing


def main():
    parser = argparse.ArgumentParser(prog="untar")
    parser.add_argument("dest")
    parser.add_argument("--suffix", default="")
    parser.add_argument("--listing")
    parser.add_argument("--deadline-s", type=int)
    args = parser.parse_args()
    dest, suffix = args.dest, args.suffix
    listing = read_listing(args.listing) if args.listing is not None else None
    if "/" in suffix or suffix in (".", ".."):
        sys.exit(f"untar: {suffix!r} is not a name suffix")
    if not os.path.isdir(dest):
        sys.exit(f"untar: {dest} is not a directory")
    if listing:
        need = sum(size for size, _ in listing.values() if size != SYMLINK)
        free = free_bytes(dest)
        if free is not None and need > free:
            sys.exit(f"untar: refused: the listed files need {need} bytes, {free} are free on "
                     f"{dest}'s filesystem: free space there, then run again")
    os.umask(0o022)
    unpacker = Unpacker(dest, suffix, listing)
    deadline = (time.monotonic() + args.deadline_s) if args.deadline_s else None
    member = None
    try:
        stream = Timed(sys.stdin.fileno(), deadline, args.deadline_s)
        with tarfile.open(fileobj=stream, mode="r|", bufsize=READ,
                          tarinfo=BoundedInfo) as archive:
            for member in archive:
                unpacker.member(archive, member)
                member = None  # a refusal while reading the next header names no member
        unpacker.finish()
    except Refused as refused:
        unpacker.drop_temporary()
        what = shown(member.name) if member is not None else "the stream"
        sys.exit(f"untar: refused {what}: {refused}")
    except TimedOut as late:
        unpacker.drop_temporary()
        sys.exit(f"untar: stopped waiting: {late}")
    except (OSError, tarfile.TarError, EOFError) as exc:
        unpacker.drop_temporary()
        where = f" at {shown(member.name)}" if member is not None else ""
        sys.exit(f"untar: failed{where}: {exc}")


main()
