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
# Sent as `python3 -I -c SCRIPT DEST [SUFFIX]` (stdin is the stream, not the script). argv: DEST,
# and SUFFIX, appended to every regular file's name
import os
import stat
import sys
import tarfile

BLOCK = 1 << 20  # file data is copied in 1 MiB blocks (tarfile's own copy uses 16 KiB)
# tarfile reads the stream READ bytes at a time (its default is 10 KiB): a pipe's worth per read(2).
# Reads of several MiB each take fresh pages from the kernel (twice the page faults on a 2 GiB
# stream, for little gain).
READ = 1 << 16
FILE_MODE = 0o755  # no setuid, setgid or sticky bit, no write for group or others


class Refused(Exception):
    pass


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
    def __init__(self, dest, suffix=""):
        self.dest = dest
        # appended to every regular file's name (a wheel from another host lands as NAME.part)
        self.suffix = suffix
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

    def file(self, archive, member, parts, rel):
        directory = self.parent(parts)
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
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
                left -= len(block)
            os.fchmod(fd, member.mode & FILE_MODE)
            try:
                os.utime(fd, (member.mtime, member.mtime))
            except (OverflowError, ValueError, OSError):
                pass
        finally:
            os.close(fd)
        self.put(temporary, os.path.join(directory, parts[-1] + self.suffix), rel + self.suffix)
        self.written.add(rel)

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
        directory = self.parent(parts)
        temporary = self.temp_in(directory)
        os.link(source, temporary, follow_symlinks=False)
        self.made(temporary)
        self.put(temporary, os.path.join(directory, parts[-1]), rel)
        self.written.add(rel)

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


def main():
    dest = sys.argv[1]
    suffix = sys.argv[2] if len(sys.argv) > 2 else ""
    if "/" in suffix or suffix in (".", ".."):
        sys.exit(f"untar: {suffix!r} is not a name suffix")
    if not os.path.isdir(dest):
        sys.exit(f"untar: {dest} is not a directory")
    os.umask(0o022)
    unpacker = Unpacker(dest, suffix)
    member = None
    try:
        stream = open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
        with tarfile.open(fileobj=stream, mode="r|", bufsize=READ) as archive:
            for member in archive:
                unpacker.member(archive, member)
            member = None
        unpacker.finish()
    except Refused as refused:
        unpacker.drop_temporary()
        sys.exit(f"untar: refused {shown(member.name)}: {refused}")
    except (OSError, tarfile.TarError, EOFError) as exc:
        unpacker.drop_temporary()
        where = f" at {shown(member.name)}" if member is not None else ""
        sys.exit(f"untar: failed{where}: {exc}")


main()
