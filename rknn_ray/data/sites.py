"""Private data that lives on its holders' own nodes (``data.private.sites``): the scans' answers,
one per site, joined into the one answer the job completes its data with.

Each site's part is scanned on the site's node (rknn_ray/job/private_scan.py runs one scan per
site, rknn_ray.data.table_scan) and read there by the site's own shards
(rknn_ray.data.table_source, placed by rknn_ray.job.placement.shard_options). What a site's
scan returns is what a one-path scan returns (counts, keyed fingerprints, a keyed digest per
shard) plus its holders' keyed hashes (:func:`rknn_ray.data.table_scan.holder_hashes`): holder
ids are public under the job's relation, so the driver may compare them, and a holder found
on two sites is refused (its records would be two clients, and its bound would hold per site,
not per holder). The per-site counts (records, holders) are public under the relation as the
job states it for sites: a record's value may be replaced, never its holder or its holder's
site, so which site holds which holders is public as which holders take part is.
"""
from __future__ import annotations

import hashlib
import hmac
import json

import numpy as np

from rknn_ray.accounting.source_identity import sorted_unique
from rknn_ray.data.table_scan import derived_key
from rknn_ray.errors import DataError


def shared_holders(sites, answers) -> tuple | None:
    """(site, other site, holders both hold) for the first pair of sites (in the config's
    order) that share a holder, compared by keyed holder hashes; None when none does."""
    keys = [np.asarray(a.get("holder_keys", ()), np.uint64) for a in answers]
    for i in range(len(sites)):
        for j in range(i + 1, len(sites)):
            both = np.intersect1d(keys[i], keys[j], assume_unique=True).size
            if both:
                return sites[i], sites[j], int(both)
    return None


def join_site_answers(sites, answers: list, key: bytes) -> dict:
    """The job's scan answer from each site's (same order as ``sites``): counts summed, shards
    concatenated site after site, fingerprints united, a keyed digest over the sites' digests;
    ``shard_sites``: each shard's (site, index in its site, the site's shard count);
    ``sites``: site name -> its public counts. A holder on two sites, or sites whose feature
    columns differ, is a DataError naming the sites and the fix."""
    shared = shared_holders(sites, answers)
    if shared is not None:
        a, b, n = shared
        raise DataError(f"data.private.sites: sites {a.name!r} and {b.name!r} both hold records "
                        f"of {n} holder(s) (the same holder id on two sites; compared by their "
                        "keyed hashes, holder ids are public under the job's relation). Fix: "
                        "keep each holder's records on one site only, or give different "
                        "holders different ids")
    first = answers[0]["columns"]
    for site, answer in zip(sites[1:], answers[1:]):
        if answer["columns"] != first:
            raise DataError(f"{site.key}: its feature columns {answer['columns']['names']} "
                            f"differ from site {sites[0].name!r}'s {first['names']}. Fix: give "
                            "every site's files the same columns and types")
    types = answers[0].get("column_types")
    for site, answer in zip(sites[1:], answers[1:]):      # the schemas' types, never a value
        other = answer.get("column_types")
        if other != types:
            differ = [f"{n!r} {b} (site {sites[0].name!r}: {a})" for n, a, b in
                      zip(first["names"], types or [], other or []) if a != b]
            raise DataError(f"{site.key}: its files type column(s) {', '.join(differ[:3])}"
                            f"{' ...' if len(differ) > 3 else ''} otherwise than site "
                            f"{sites[0].name!r}'s. Fix: give every site's files the same "
                            "columns and types (cast them when you write the files)")
    clients, digests, kept, shard_sites, per_site = [], [], [], [], {}
    for site, answer in zip(sites, answers):
        n = site.shards
        pad = n - len(answer["clients"])        # a site with fewer rows than shards
        clients += [int(c) for c in answer["clients"]] + [0] * pad
        digests += [tuple(d) for d in answer["shard_digests"]] + [(0, f"{0:016x}")] * pad
        kept += [int(c) for c in answer["kept_per_shard"]] + [0] * pad
        shard_sites += [(site, i, n) for i in range(n)]
        per_site[site.name] = {"records": int(answer["rows"]), "holders": int(answer["holders"]),
                               "shards": n}
    h = hmac.new(derived_key(key, "digest"), b"rknn-ray sites", hashlib.sha256)
    h.update(json.dumps([[s.name, a["digest"]] for s, a in zip(sites, answers)]).encode())
    return {"rows": sum(int(a["rows"]) for a in answers),
            "holders": sum(int(a["holders"]) for a in answers),
            "kept": sum(int(a["kept"]) for a in answers),
            "largest_holder": max(int(a["largest_holder"]) for a in answers),
            "clients": clients, "shard_digests": digests, "kept_per_shard": kept,
            "digest": h.hexdigest()[:32],
            "fingerprints": sorted_unique(np.concatenate([a["fingerprints"] for a in answers])),
            "near": sorted_unique(np.concatenate([a["near"] for a in answers])),
            "columns": first, "shard_sites": shard_sites, "sites": per_site,
            # each site's parts (actors/parts_holder.py), taken by the site's own shards
            "parts": {site.name: answer.get("parts") for site, answer in zip(sites, answers)}}
