"""How fast a collection file can be copied here (issue 14, adr/0034-one-file-edit-cost.md): shutil.copyfile
(sendfile), os.copy_file_range, a sendfile loop, each with its fsync and the unlink of the
copy's last name, and whether the file system clones (FICLONE).

    python benchmarks/copy_methods.py SOURCE_FILE SCRATCH_DIR
"""
import os, shutil, time, sys
src = sys.argv[1]
d = sys.argv[2]
os.makedirs(d, exist_ok=True)
def fsync(p):
    fd = os.open(p, os.O_RDONLY); os.fsync(fd); os.close(fd)
def m_shutil(dst):
    os.close(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    shutil.copyfile(src, dst)
def m_cfr(dst):
    fi = os.open(src, os.O_RDONLY); fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    n = os.fstat(fi).st_size; off = 0
    while off < n:
        off += os.copy_file_range(fi, fo, n - off, off, off)
    os.close(fi); os.close(fo)
def m_sendfile(dst):
    fi = os.open(src, os.O_RDONLY); fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    n = os.fstat(fi).st_size; off = 0
    while off < n:
        off += os.sendfile(fo, fi, off, n - off)
    os.close(fi); os.close(fo)
def m_ficlone(dst):
    import fcntl
    fi = os.open(src, os.O_RDONLY); fo = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        fcntl.ioctl(fo, 0x40049409, fi)  # FICLONE
        return "ok"
    except OSError as e:
        return f"FICLONE: {e}"
    finally:
        os.close(fi); os.close(fo)
print(m_ficlone(d + "/clone")); os.unlink(d + "/clone")
for rep in range(2):
    for name, f in (("shutil.copyfile", m_shutil), ("copy_file_range", m_cfr), ("sendfile", m_sendfile)):
        dst = f"{d}/{name}"
        if os.path.exists(dst): os.unlink(dst)
        t0 = time.perf_counter(); c0 = time.process_time()
        f(dst); t1 = time.perf_counter()
        fsync(dst); t2 = time.perf_counter()
        os.link(dst, dst + ".keep"); t3 = time.perf_counter()
        os.unlink(dst); t4 = time.perf_counter()
        os.unlink(dst + ".keep"); t5 = time.perf_counter()
        print(f"{name:16s} copy {t1-t0:.2f} s (cpu {time.process_time()-c0:.2f}) fsync {t2-t1:.2f} unlink-last-link {t5-t4:.2f} load {os.getloadavg()[0]:.1f}", flush=True)
