/* The native half of lookupdec/fast/_mapbytes.py (built with the compiled modules, Linux only).
 *
 * map_file: the file mapped read-only behind the header of a CPython bytes object, in one call.
 * _mapbytes does the same through ctypes where this module is not built; here it costs a few
 * system calls, where the first call of each ctypes function in a process cost more than the
 * system calls themselves (docs/performance-log.md). The object's layout is _mapbytes'
 * knowledge: it passes the header's bytes and its length in.
 *
 * start/cancel/finished: populate a mapping from a native thread that never takes the GIL.
 * _mapbytes maps index and corpus files and then asks the kernel to map every page of them into
 * the process (MADV_POPULATE_READ), so drafting takes no page faults and the file's 2 MiB folios
 * are mapped as huge pages. Done by the opener, that costs time in proportion to the file (a few
 * ms for 30 MB); done by a Python thread, it costs the thread's start (the opener waits for it:
 * the thread needs the GIL until its first ctypes call releases it, and a compiled replay holds
 * the GIL for as long as it runs). A pthread started here runs no Python at all, so the caller
 * pays one clone() and nothing waits.
 *
 * The thread populates in chunks and checks a cancel flag between them, so closing the
 * mapping (munmap, which waits for a madvise in progress on it) waits for one chunk at most,
 * not for the whole file. A chunk that fails with ENOMEM means the range was unmapped
 * meanwhile: the thread stops. EINVAL means the kernel has no MADV_POPULATE_READ (before
 * Linux 5.14): the thread asks for readahead of the rest instead (MADV_WILLNEED) and stops.
 *
 * A job is shared by the thread and its owner (a MappedBytes), each holding one reference;
 * the last one to let go frees it. After fork() the child has no thread: its jobs keep one
 * reference forever (a few bytes), which is harmless.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14+ (asm-generic); older headers lack it */
#endif

/* Bytes per madvise call: large enough that the calls cost nothing next to the page work,
 * small enough that a close waits little (about 0.1 ms for a cached 4 MiB). A multiple of
 * 2 MiB, so a chunk never splits a huge page. */
#define CHUNK ((size_t)4 << 20)

typedef struct {
    uintptr_t start;
    size_t length;
    int cancel;   /* set by the owner, read by the thread (atomics) */
    int done;     /* set by the thread when it stops (atomics) */
    int refs;     /* thread + owner */
} job_t;

static void release(job_t *job) {
    if (__atomic_sub_fetch(&job->refs, 1, __ATOMIC_ACQ_REL) == 0)
        free(job);
}

static void *run(void *arg) {
    job_t *job = (job_t *)arg;
    size_t off = 0;
    /* Normal priority, on purpose. At SCHED_IDLE the kernel also gives the thread's reads the
     * idle I/O class, and a drafting thread that faults on a page this thread is reading then
     * waits for that starved read (measured: the first chunks of a replay from a 2.4 GB index
     * not in the page cache drafted at 1,140 µs per token against 270-390 at normal priority). */
    while (off < job->length && !__atomic_load_n(&job->cancel, __ATOMIC_ACQUIRE)) {
        size_t n = job->length - off < CHUNK ? job->length - off : CHUNK;
        if (madvise((void *)(job->start + off), n, MADV_POPULATE_READ) != 0) {
            if (errno == EINVAL)
                madvise((void *)(job->start + off), job->length - off, MADV_WILLNEED);
            break; /* ENOMEM: unmapped meanwhile; anything else: nothing more to do */
        }
        off += n;
    }
    __atomic_store_n(&job->done, 1, __ATOMIC_RELEASE);
    release(job);
    return NULL;
}

static PyObject *start(PyObject *self, PyObject *args) {
    unsigned long long addr, length;
    if (!PyArg_ParseTuple(args, "KK", &addr, &length))
        return NULL;
    if (addr % 4096 != 0)
        return PyErr_Format(PyExc_ValueError, "address %llu is not page-aligned", addr);
    job_t *job = calloc(1, sizeof(job_t));
    if (job == NULL)
        return PyErr_NoMemory();
    job->start = (uintptr_t)addr;
    job->length = (size_t)length;
    job->refs = 2;
    pthread_attr_t attr;
    pthread_t tid;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        /* The thread needs almost no stack: 64 KiB instead of the default 8 MiB of address space. */
        pthread_attr_setstacksize(&attr, 1 << 16);
        rc = pthread_create(&tid, &attr, run, job);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        free(job);
        Py_RETURN_NONE; /* no thread: the caller falls back to its own way */
    }
    return PyLong_FromVoidPtr(job);
}

static job_t *job_arg(PyObject *arg) {
    void *p = PyLong_AsVoidPtr(arg);
    if (p == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "not a prefetch job");
    return (job_t *)p;
}

static PyObject *cancel(PyObject *self, PyObject *arg) {
    job_t *job = job_arg(arg);
    if (job == NULL)
        return NULL;
    __atomic_store_n(&job->cancel, 1, __ATOMIC_RELEASE);
    release(job);
    Py_RETURN_NONE;
}

static PyObject *finished(PyObject *self, PyObject *arg) {
    job_t *job = job_arg(arg);
    if (job == NULL)
        return NULL;
    return PyBool_FromLong(__atomic_load_n(&job->done, __ATOMIC_ACQUIRE));
}

/* Files of at least this size start at a multiple of it (see _mapbytes._HUGE). */
#define HUGE_ALIGN ((size_t)2 << 20)

/* OSError(errno, "<what>: <strerror>"), the errors of _mapbytes' ctypes path. */
static PyObject *os_error(int e, const char *what, unsigned long long n) {
    PyObject *err = Py_BuildValue("(iN)", e, PyUnicode_FromFormat(what, n, strerror(e)));
    if (err != NULL) {
        PyErr_SetObject(PyExc_OSError, err);
        Py_DECREF(err);
    }
    return NULL;
}

static PyObject *map_file(PyObject *self, PyObject *args) {
    int fd;
    unsigned long long size_arg;
    const char *head;
    Py_ssize_t head_len;
    if (!PyArg_ParseTuple(args, "iKy#", &fd, &size_arg, &head, &head_len))
        return NULL;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t size = (size_t)size_arg;
    if (size == 0 || head_len <= 0 || (size_t)head_len > page)
        return PyErr_Format(PyExc_ValueError, "map_file: size %llu, header of %zd bytes", size_arg, head_len);
    /* One header page, the data and at least one byte more (the NUL bytes data ends with), with
     * room to align the data's start: the layout of _mapbytes._reserve. */
    size_t align = size >= HUGE_ALIGN ? HUGE_ALIGN : page;
    size_t length = page + (size + 1 + page - 1) / page * page + (align - page);
    char *base = mmap(NULL, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return os_error(errno, "mmap of %llu anonymous bytes: %s", (unsigned long long)length);
    uintptr_t start = ((uintptr_t)base + page + align - 1) / align * align;
    if (mmap((void *)start, size, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0) != (void *)start) {
        int e = errno;
        munmap(base, length);
        return os_error(e, "mmap of the file (%llu bytes): %s", size_arg);
    }
    if (size >= HUGE_ALIGN) /* pages read in through this mapping come in 2 MiB folios (a hint) */
        madvise((void *)start, (size + page - 1) / page * page, MADV_HUGEPAGE);
    memcpy((char *)start - head_len, head, (size_t)head_len);
    PyObject *obj = (PyObject *)((char *)start - head_len);
    Py_INCREF(obj);
    return Py_BuildValue("KKKN", (unsigned long long)(uintptr_t)base, (unsigned long long)length,
                         (unsigned long long)start, obj);
}

static PyObject *unmap(PyObject *self, PyObject *args) {
    unsigned long long base, length;
    if (!PyArg_ParseTuple(args, "KK", &base, &length))
        return NULL;
    if (munmap((void *)(uintptr_t)base, (size_t)length) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"map_file", map_file, METH_VARARGS,
     "map_file(fd, size, head) -> (base, length, start, obj): the file mapped read-only at start, "
     "head written just before it; obj is the object whose header head is."},
    {"unmap", unmap, METH_VARARGS, "unmap(base, length): munmap a map_file reservation."},
    {"start", start, METH_VARARGS,
     "start(addr, length) -> job or None: populate the page-aligned mapped range in a native thread."},
    {"cancel", cancel, METH_O,
     "cancel(job): stop after the chunk in progress and let go of the job (call once, before unmapping)."},
    {"finished", finished, METH_O, "finished(job) -> bool: whether the thread has stopped."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_mapnative",
    "The native half of lookupdec.fast._mapbytes: map_file, and the prefetch thread.", -1, methods,
};

PyMODINIT_FUNC PyInit__mapnative(void) { return PyModule_Create(&module); }
