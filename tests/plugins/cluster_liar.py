"""A compromised Dask worker, for tests/test_cluster.py: ``client.run(install, mode, marker_dir)``
makes each worker's ``process_batch`` lie in one way, ``client.run(uninstall)`` makes it honest
again. Any process that can reach a scheduler could do the same with ``Client.run``.

``install_on_scheduler`` does the same to the scheduler, which any client that reaches it can
patch with ``Client.run_on_scheduler``. The lies that carry code are objects whose unpickling
writes ``ran-in-<pid>`` into ``marker_dir``: the test checks that no such file names the
ingesting process."""

import os

from groundkit_datasette.indexing import cluster

_HONEST = {}


class Evil:
    """Unpickled anywhere, writes a file naming the process that unpickled it."""

    def __init__(self, marker_dir):
        self.marker_dir = str(marker_dir)

    def __reduce__(self):
        code = f"import os; open(os.path.join({self.marker_dir!r}, 'ran-in-%d' % os.getpid()), 'w').close()"
        return (exec, (code,))


def _each(results, change):
    for r in results:
        if isinstance(r, dict) and "text" in r:
            change(r)
        elif hasattr(r, "acl"):  # the pre-issue-33 result: a _Prepared object
            change(r)


def _set(key, value):
    def change(r):
        if isinstance(r, dict):
            r[key] = value
        else:
            setattr(r, key, value)
    return change


def install(mode, marker_dir=None):
    honest = _HONEST.setdefault("process_batch", cluster.process_batch)

    def lying(jobs, have, settings):
        if mode == "raise_evil":  # Dask pickles the error, arguments and all
            raise RuntimeError(Evil(marker_dir))
        if mode == "return_evil":
            return [Evil(marker_dir) for _ in jobs]
        results = honest(jobs, have, settings)
        if mode == "acl":  # the worker says the document is open to everyone
            _each(results, _set("acl", None))
        elif mode == "source":  # another file's name (an access list would follow it)
            _each(results, _set("source", "secret/elsewhere.md"))
        elif mode == "file_hash":
            _each(results, _set("file_hash", "0" * 64))
        elif mode == "count":
            results = results[1:]
        elif mode == "offsets":
            def change(r):
                if isinstance(r, dict):
                    r["chunks"] = [[0, len(r["text"]) + 500, "h"]]
                else:
                    r.chunks = [c.__class__(**{**c.__dict__, "end": c.end + 10_000}) for c in r.chunks]
            _each(results, change)
        elif mode == "extractor":
            _each(results, _set("extractor", "pypdf"))
        elif mode in ("vector_nan", "vector_size"):
            def change(r):
                if isinstance(r, dict):
                    import numpy as np
                    v = np.frombuffer(r["vectors"], dtype="<f4").copy()
                    if mode == "vector_nan":
                        v[0] = np.nan
                    else:
                        v = v[:-1]
                    r["vectors"] = v.tobytes()
                else:
                    import numpy as np
                    for cid in r.vectors:
                        r.vectors[cid] = (np.full_like(r.vectors[cid], np.nan) if mode == "vector_nan"
                                          else r.vectors[cid][:-1])
            _each(results, change)
        return results

    cluster.process_batch = lying
    return os.getpid()


def uninstall():
    if "process_batch" in _HONEST:
        cluster.process_batch = _HONEST["process_batch"]
    return os.getpid()


def install_on_scheduler(marker_dir, dask_scheduler=None):
    """``client.run_on_scheduler(install_on_scheduler, marker_dir)``: the scheduler answers every
    gather with a message part marked as pickled, which Dask's wire protocol unpickles on read
    whatever the reader's deserializers."""
    from distributed.protocol.serialize import ToPickle

    async def gather(keys=(), serializers=None):
        return {"status": "OK", "data": {k: ToPickle(Evil(marker_dir)) for k in keys}}

    _HONEST.setdefault("gather", dask_scheduler.handlers["gather"])
    dask_scheduler.handlers["gather"] = gather
    return os.getpid()


def uninstall_on_scheduler(dask_scheduler=None):
    if "gather" in _HONEST:
        dask_scheduler.handlers["gather"] = _HONEST.pop("gather")
    return os.getpid()
