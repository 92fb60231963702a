# Part of venv_state.py (inlined into it by remote.script, as _common.py is): a venv's listing,
# every distribution's name, version, installer and RECORD rows, read from its .dist-info
# directories (`parse_listing`) or from the generation's index (INDEX: `indexed_listing`, used while
# the .dist-info files are those it was written from, `listing_key`), and the index written
# (`write_index`, venv_state.py's `write-index` mode). Apart from the read because it is the one
# thing both of venv_state.py's jobs do: the read checks the files the listing names, the
# `write-index` mode writes the listing down. venv_state.py (beside it) says what the read does
# and why.

import csv
import glob
import json
import os

from _common import (  # noqa: E402 - remote.script puts _common.py here
    UntrustedPath,
    make_dirs,
    new_file,
    norm,
)


def metadata(dist_info):
    name = version = None
    try:
        with open(os.path.join(dist_info, "METADATA"), encoding="utf-8",
                  errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break
                if line.startswith("Name:"):
                    name = line[5:].strip()
                elif line.startswith("Version:"):
                    version = line[8:].strip()
    except OSError:
        pass
    return name, version


def read_record(path):
    """A RECORD's rows (path, hash, size), or None without one. Quotes (a path with a comma) need
    the csv module; without any, splitting each line is the same and several times faster."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            text = handle.read()
    except OSError:
        return None
    if '"' in text:
        return [row for row in csv.reader(text.splitlines()) if row]
    return [line.split(",") for line in text.splitlines()]



# beside STAMP: the generation's listing, written by the deploy
INDEX = os.path.join(".sglang-deploy", "record-index.json")
INDEX_FORMAT = 1
KEY_FILES = ("METADATA", "INSTALLER", "RECORD")


def site_of(venv):
    sites = glob.glob(os.path.join(venv, "lib", "python3*", "site-packages"))
    return sites[0] if sites else None


def dist_infos(site):
    return sorted(glob.glob(os.path.join(site, "*.dist-info"))) if site else []


def listing_key(site, infos):
    """What a listing is read from: every .dist-info's METADATA, INSTALLER and RECORD as (inode,
    size, mtime, ctime). Writing one, replacing one, putting an mtime back (which sets the ctime),
    adding or removing a distribution: each changes it. A few hundred stat calls, against reading
    and splitting every RECORD."""
    key = [site]
    for dist_info in infos:
        entry = [os.path.basename(dist_info)]
        for name in KEY_FILES:
            try:
                st = os.stat(os.path.join(dist_info, name))
                entry.append([st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns])
            except OSError:
                entry.append(None)
        key.append(entry)
    return key


def parse_listing(infos):
    """(dists, rels, hashes, sizes) read from the .dist-info directories: each distribution with a
    name and a version as [normalised name, version, installer, has a RECORD, its number of rows],
    and the RECORD rows of all of them in one flat list, in that order (path, hash and size as
    RECORD writes them, "" where absent; bytecode left out)."""
    dists, rels, hashes, sizes = [], [], [], []
    for dist_info in infos:
        name, version = metadata(dist_info)
        if not name or not version:
            continue
        try:
            with open(os.path.join(dist_info, "INSTALLER")) as handle:
                installer = handle.read().strip()
        except OSError:
            installer = ""
        rows = read_record(os.path.join(dist_info, "RECORD"))
        entries = [row for row in rows or () if row[0] and not row[0].endswith(".pyc")]
        rels += [row[0] for row in entries]
        hashes += [row[1] if len(row) > 1 else "" for row in entries]
        sizes += [row[2] if len(row) > 2 else "" for row in entries]
        dists.append([norm(name), version, installer, rows is not None, len(entries)])
    return dists, rels, hashes, sizes


def indexed_listing(venv, key):
    """(listing, how): the generation's index when it was written from exactly the files of `key`
    ("used"), else None and why not: "missing", or "stale" (the .dist-info files changed since, or
    it cannot be read)."""
    try:
        with open(os.path.join(venv, INDEX), encoding="utf-8") as handle:
            index = json.load(handle)
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError):
        return None, "stale"
    try:
        if index["format"] != INDEX_FORMAT or index["key"] != key:
            return None, "stale"
        dists, rels, hashes, sizes = index["dists"], index["rels"], index["hashes"], index["sizes"]
        if not len(rels) == len(hashes) == len(sizes) == sum(dist[4] for dist in dists):
            return None, "stale"
    except (KeyError, TypeError, IndexError):
        return None, "stale"
    return (dists, rels, hashes, sizes), "used"


def write_index(venv):
    """Write `venv`'s index (INDEX) of its distributions' RECORD rows, for the fast checks after
    this one.

    What it says, as (written, why not): not written when the .dist-info files changed while they
    were read (the next check finds the index stale and the deploy writes it again)."""
    site = site_of(venv)
    if site is None:
        return False, "no site-packages"
    infos = dist_infos(site)
    key = listing_key(site, infos)
    dists, rels, hashes, sizes = parse_listing(infos)
    if dist_infos(site) != infos or listing_key(site, infos) != key:
        return False, "its .dist-info files changed while they were read"
    index = {"format": INDEX_FORMAT, "key": key, "dists": dists, "rels": rels,
             "hashes": hashes, "sizes": sizes}
    path = os.path.join(venv, INDEX)
    try:
        # exclusively where missing, checked on its handle: root's
        make_dirs(os.path.dirname(path), 0o755)
    except UntrustedPath as exc:
        return False, str(exc)
    # Written beside and renamed in: a reader finds the old index or the new one, never part of one
    # (and a part left by a crash is unreadable JSON: stale, so the RECORDs are read instead). Made
    # afresh, never written through a link.
    with new_file(path + ".tmp") as handle:
        json.dump(index, handle)
    os.replace(path + ".tmp", path)
    return True, ""

