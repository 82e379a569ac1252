/* polytile's native dispatcher: the cached call path of a TC function in C.

   A Dispatcher holds one entry per compiled kernel of a function (a shape set and
   the values of its integer scalars, TCFunction._key). Called with the raw call
   arguments, it finds the entry whose shapes and integer values they match, checks
   every argument as CompiledFunction.run_fast does in Python (exact NumPy arrays of
   the parameter's dtype, C-contiguous and aligned; out= arrays writeable and
   overlapping no input or other output; scalars in range), allocates the outputs,
   runs the kernel with the GIL released and returns the output(s). Anything it does
   not take returns NotImplemented, and the caller takes the checked Python path,
   which converts the argument or raises the error; a kernel's failure code goes to
   the entry's `fail` callable, which raises.

   Built by polytile/runtime/dispatch.py with the host's compiler against this
   Python's and NumPy's headers; without them the Python path runs alone. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <math.h>
#include <stdint.h>

#include <string.h>

typedef int32_t (*pt_kernel)(void **args, int64_t *err);

#define PT_MAX_ARGS 128             /* parameters and outputs of one kernel */
#define PT_TORCH_DIMS 16            /* the most dimensions a torch tensor argument has here */

enum { P_TENSOR = 0, P_FLOAT = 1, P_INT = 2 };

typedef struct {
    int kind;
    PyArray_Descr *descr;          /* the parameter's dtype */
    int ndim;                      /* tensors: the entry's shape */
    npy_intp dims[NPY_MAXDIMS];
    double limit;                  /* float scalars: |x| >= limit overflows (inf is kept) */
    long long value;               /* integer scalars: the value the kernel is made for */
    PyObject *torch_dtype;         /* tensors: the torch dtype of descr, once looked up */
    int itemsize;                  /* scalars: bytes the kernel reads */
} Param;

typedef struct {
    PyArray_Descr *descr;
    int ndim;
    npy_intp dims[NPY_MAXDIMS];
    PyObject *alloc;               /* None: uncleared; True: zeros; else alloc(shape, dtype) */
    PyObject *shape;               /* the shape as a tuple, for alloc */
} Output;

/* An entry is freed when its last holder lets go: the dispatcher's table and each call
   running it, since a call may run Python (an allocator, `fail`) while another thread
   clears the table. The GIL guards `refs`. */
typedef struct {
    Py_ssize_t refs;
    pt_kernel fn;
    Py_ssize_t n_params, n_outputs;
    Param *params;
    Output *outputs;
    PyObject *fail;                /* fail(code, param, dim, index): raises */
    PyObject *owner;               /* keeps the shared object loaded */
} Entry;

typedef struct {
    PyObject_HEAD
    Entry **entries;
    Py_ssize_t n_entries;
} Dispatcher;

static void entry_free(Entry *e)
{
    for (Py_ssize_t k = 0; e->params != NULL && k < e->n_params; k++) {
        Py_XDECREF(e->params[k].descr);
        Py_XDECREF(e->params[k].torch_dtype);
    }
    for (Py_ssize_t k = 0; e->outputs != NULL && k < e->n_outputs; k++) {
        Py_XDECREF(e->outputs[k].descr);
        Py_XDECREF(e->outputs[k].alloc);
        Py_XDECREF(e->outputs[k].shape);
    }
    PyMem_Free(e->params);
    PyMem_Free(e->outputs);
    Py_XDECREF(e->fail);
    Py_XDECREF(e->owner);
    PyMem_Free(e);
}

static void entry_release(Entry *e)
{
    if (--e->refs == 0)
        entry_free(e);
}

static void dispatcher_dealloc(Dispatcher *self)
{
    for (Py_ssize_t k = 0; k < self->n_entries; k++)
        entry_release(self->entries[k]);
    PyMem_Free(self->entries);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int read_dims(PyObject *shape, int *ndim, npy_intp *dims)
{
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > NPY_MAXDIMS) {
        PyErr_SetString(PyExc_TypeError, "a shape must be a tuple of ints (NPY_MAXDIMS at most)");
        return -1;
    }
    *ndim = (int)PyTuple_GET_SIZE(shape);
    for (int d = 0; d < *ndim; d++) {
        dims[d] = (npy_intp)PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (dims[d] == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* add(address, params, outputs, fail, owner): params holds (0, dtype, shape),
   (1, dtype, limit) or (2, dtype, value) per parameter; outputs (dtype, shape, alloc). */
static PyObject *dispatcher_add(Dispatcher *self, PyObject *args)
{
    unsigned long long address;
    PyObject *params, *outputs, *fail, *owner;
    if (!PyArg_ParseTuple(args, "KO!O!OO", &address, &PyTuple_Type, &params, &PyTuple_Type,
                          &outputs, &fail, &owner))
        return NULL;
    Entry *e = PyMem_Calloc(1, sizeof(Entry));
    if (e == NULL)
        return PyErr_NoMemory();
    e->refs = 1;
    e->fn = (pt_kernel)(uintptr_t)address;
    e->n_params = PyTuple_GET_SIZE(params);
    e->n_outputs = PyTuple_GET_SIZE(outputs);
    Py_INCREF(fail);
    e->fail = fail;
    Py_INCREF(owner);
    e->owner = owner;
    e->params = PyMem_Calloc(e->n_params ? e->n_params : 1, sizeof(Param));
    e->outputs = PyMem_Calloc(e->n_outputs ? e->n_outputs : 1, sizeof(Output));
    if (e->params == NULL || e->outputs == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    if (e->n_params + e->n_outputs > PT_MAX_ARGS) {
        PyErr_SetString(PyExc_ValueError, "too many parameters for the native call path");
        goto fail;
    }
    for (Py_ssize_t k = 0; k < e->n_params; k++) {
        Param *p = &e->params[k];
        PyObject *dtype, *what;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(params, k), "iOO", &p->kind, &dtype, &what)
                || !PyArray_DescrConverter(dtype, &p->descr))
            goto fail;
        PyObject *size = PyObject_GetAttrString((PyObject *)p->descr, "itemsize");
        if (size == NULL)
            goto fail;
        p->itemsize = (int)PyLong_AsLong(size);
        Py_DECREF(size);
        if (p->kind == P_TENSOR) {
            if (read_dims(what, &p->ndim, p->dims) < 0)
                goto fail;
        } else if (p->kind == P_FLOAT) {
            p->limit = PyFloat_AsDouble(what);
            if (PyErr_Occurred())
                goto fail;
            if (p->descr->type_num != NPY_FLOAT32 && p->descr->type_num != NPY_FLOAT64) {
                PyErr_SetString(PyExc_ValueError, "float scalars are float32 or float64");
                goto fail;
            }
        } else if (p->kind == P_INT) {
            p->value = PyLong_AsLongLong(what);
            if (PyErr_Occurred())
                goto fail;
            if (!PyTypeNum_ISINTEGER(p->descr->type_num)
                    && p->descr->type_num != NPY_BOOL) {
                PyErr_SetString(PyExc_ValueError, "an integer scalar has an integer dtype");
                goto fail;
            }
        } else {
            PyErr_SetString(PyExc_ValueError, "parameter kind is 0, 1 or 2");
            goto fail;
        }
    }
    for (Py_ssize_t k = 0; k < e->n_outputs; k++) {
        Output *o = &e->outputs[k];
        PyObject *dtype, *shape, *alloc;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(outputs, k), "OOO", &dtype, &shape, &alloc))
            goto fail;
        Py_INCREF(shape);
        o->shape = shape;
        Py_INCREF(alloc);
        o->alloc = alloc;
        if (!PyArray_DescrConverter(dtype, &o->descr) || read_dims(o->shape, &o->ndim, o->dims) < 0)
            goto fail;
    }
    Entry **grown = PyMem_Realloc(self->entries, (self->n_entries + 1) * sizeof(Entry *));
    if (grown == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    self->entries = grown;
    self->entries[self->n_entries++] = e;
    Py_RETURN_NONE;
fail:
    entry_release(e);
    return NULL;
}

static PyObject *dispatcher_clear(Dispatcher *self, PyObject *unused)
{
    (void)unused;
    Py_ssize_t n = self->n_entries;
    self->n_entries = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        entry_release(self->entries[k]);
    Py_RETURN_NONE;
}

/* The integer an int or bool argument holds, in *v; 0 when it is neither (or too big). */
static int integer_value(PyObject *a, long long *v)
{
    if (!PyLong_CheckExact(a) && !PyBool_Check(a))
        return 0;
    int overflow;
    *v = PyLong_AsLongLongAndOverflow(a, &overflow);
    if (overflow || (*v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

/* Whether a tensor of this shape, or this integer argument, is what parameter p of an
   entry was compiled for (TCFunction._key: shapes and integer scalars). */
static int same_shape(const Param *p, int ndim, const npy_intp *dims)
{
    return ndim == p->ndim && memcmp(dims, p->dims, ndim * sizeof(npy_intp)) == 0;
}

static int same_integer(const Param *p, PyObject *a)
{
    long long v;
    return integer_value(a, &v) && v == p->value;
}

/* Whether args (a tuple of the function's arity) match the entry's shapes and integers. */
static int matches(const Entry *e, PyObject *args)
{
    for (Py_ssize_t k = 0; k < e->n_params; k++) {
        const Param *p = &e->params[k];
        PyObject *a = PyTuple_GET_ITEM(args, k);
        if (p->kind == P_TENSOR) {
            if (!PyArray_CheckExact(a) || !same_shape(p, PyArray_NDIM((PyArrayObject *)a),
                                                      PyArray_DIMS((PyArrayObject *)a)))
                return 0;
        } else if (p->kind == P_INT && !same_integer(p, a)) {
            return 0;
        }
    }
    return 1;
}

static int same_dtype(PyArray_Descr *have, PyArray_Descr *want)
{
    return have == want || PyArray_EquivTypes(have, want);
}

/* Bytes [lo, hi) an array's data spans (C-contiguous). */
static void span(PyArrayObject *a, char **lo, char **hi)
{
    *lo = PyArray_BYTES(a);
    *hi = *lo + PyArray_NBYTES(a);
}

static int overlap(PyArrayObject *a, PyArrayObject *b)
{
    char *alo, *ahi, *blo, *bhi;
    span(a, &alo, &ahi);
    span(b, &blo, &bhi);
    return alo < bhi && blo < ahi && alo != ahi && blo != bhi;
}

static int usable(PyArrayObject *a, PyArray_Descr *descr)
{
    return same_dtype(PyArray_DESCR(a), descr) && PyArray_IS_C_CONTIGUOUS(a)
        && PyArray_ISALIGNED(a);
}

static PyObject *new_output(const Output *o)
{
    if (o->alloc == Py_None) {
        Py_INCREF(o->descr);
        return PyArray_NewFromDescr(&PyArray_Type, o->descr, o->ndim, (npy_intp *)o->dims,
                                    NULL, NULL, 0, NULL);
    }
    if (o->alloc == Py_True) {
        Py_INCREF(o->descr);
        return PyArray_Zeros(o->ndim, (npy_intp *)o->dims, o->descr, 0);
    }
    PyObject *made = PyObject_CallFunctionObjArgs(o->alloc, o->shape, (PyObject *)o->descr,
                                                  NULL);
    if (made != NULL && !(PyArray_Check(made) && PyArray_IS_C_CONTIGUOUS((PyArrayObject *)made)
                          && PyArray_NBYTES((PyArrayObject *)made)
                             == PyArray_MultiplyList((npy_intp *)o->dims, o->ndim)
                                * PyArray_ITEMSIZE((PyArrayObject *)made))) {
        PyErr_SetString(PyExc_TypeError, "an output allocator returned no C-contiguous array "
                        "of the output's size");
        Py_CLEAR(made);
    }
    return made;
}

/* ------------------------------------------------------------- torch tensors
   Set by use_torch() (polytile.torch): the plain tensor types, wrap(ndarray) -> tensor
   for the outputs, and pairs (NumPy dtype, torch dtype). A torch call (Dispatcher.torch)
   reads each tensor argument's shape, dtype, place, layout and data pointer. */
static PyObject *torch_types;      /* tuple of types */
static PyObject *torch_wrap;
static PyObject *torch_pairs;      /* tuple of (np.dtype, torch.dtype) */
static PyObject *s_shape, *s_dtype, *s_is_cpu, *s_is_contiguous, *s_data_ptr;

typedef struct {
    int ndim;
    npy_intp dims[PT_TORCH_DIMS];
    PyObject *dtype;               /* compared by identity only (no reference held) */
    int dense;                     /* on the CPU and contiguous */
    void *data;
} TorchView;

static PyObject *use_torch(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *types, *wrap, *pairs;
    if (!PyArg_ParseTuple(args, "O!OO!", &PyTuple_Type, &types, &wrap, &PyTuple_Type, &pairs))
        return NULL;
    Py_INCREF(types);
    Py_XSETREF(torch_types, types);
    Py_INCREF(wrap);
    Py_XSETREF(torch_wrap, wrap);
    Py_INCREF(pairs);
    Py_XSETREF(torch_pairs, pairs);
    Py_RETURN_NONE;
}

static int is_torch_tensor(PyObject *a)
{
    if (torch_types == NULL)
        return 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(torch_types); k++)
        if ((PyObject *)Py_TYPE(a) == PyTuple_GET_ITEM(torch_types, k))
            return 1;
    return 0;
}

/* 1 with *v filled; 0 (no exception) for what the Python path must take. */
static int torch_view(PyObject *a, TorchView *v)
{
    PyObject *shape = NULL, *dtype = NULL, *cpu = NULL, *contiguous = NULL, *ptr = NULL;
    int ok = 0;
    if ((shape = PyObject_GetAttr(a, s_shape)) == NULL || !PyTuple_Check(shape)
            || PyTuple_GET_SIZE(shape) > PT_TORCH_DIMS)
        goto done;
    v->ndim = (int)PyTuple_GET_SIZE(shape);
    for (int d = 0; d < v->ndim; d++) {
        v->dims[d] = (npy_intp)PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
        if (v->dims[d] == -1 && PyErr_Occurred())
            goto done;
    }
    if ((dtype = PyObject_GetAttr(a, s_dtype)) == NULL
            || (cpu = PyObject_GetAttr(a, s_is_cpu)) == NULL
            || (contiguous = PyObject_CallMethodNoArgs(a, s_is_contiguous)) == NULL
            || (ptr = PyObject_CallMethodNoArgs(a, s_data_ptr)) == NULL)
        goto done;
    v->dtype = dtype;
    v->dense = cpu == Py_True && contiguous == Py_True;
    v->data = PyLong_AsVoidPtr(ptr);
    ok = !PyErr_Occurred();
done:
    PyErr_Clear();
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(cpu);
    Py_XDECREF(contiguous);
    Py_XDECREF(ptr);
    return ok;
}

/* The torch dtype of a tensor parameter, or NULL. */
static PyObject *torch_dtype(Param *p)
{
    if (p->torch_dtype == NULL && torch_pairs != NULL) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(torch_pairs); k++) {
            PyObject *pair = PyTuple_GET_ITEM(torch_pairs, k);
            PyArray_Descr *numpy = NULL;
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
                    || !PyArray_DescrConverter(PyTuple_GET_ITEM(pair, 0), &numpy)) {
                PyErr_Clear();
                continue;
            }
            int same = same_dtype(numpy, p->descr);
            Py_DECREF(numpy);
            if (same) {
                p->torch_dtype = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
                break;
            }
        }
    }
    return p->torch_dtype;
}

typedef union { double f64; float f32; long long i64; int32_t i32; int16_t i16;
                int8_t i8; } Scalar;

/* A scalar argument as the kernel reads it; 0 when the Python path must take it. */
static int scalar(const Param *p, PyObject *a, Scalar *s)
{
    if (p->kind == P_INT) {         /* matched: an int or bool of the entry's value */
        long long v = p->value;
        switch (p->itemsize) {
        case 8: s->i64 = v; return 1;
        case 4: s->i32 = (int32_t)v; return 1;
        case 2: s->i16 = (int16_t)v; return 1;
        case 1: s->i8 = (int8_t)v; return 1;
        default: return 0;
        }
    }
    double x;
    if (PyFloat_CheckExact(a)) {
        x = PyFloat_AS_DOUBLE(a);
    } else {
        long long v;
        /* ints up to 2^53 convert exactly to a double, then round once */
        if (!integer_value(a, &v) || v > (1LL << 53) || v < -(1LL << 53))
            return 0;
        x = (double)v;
    }
    if (isfinite(x) && fabs(x) >= p->limit)
        return 0;
    if (p->descr->type_num == NPY_FLOAT32)
        s->f32 = (float)x;
    else
        s->f64 = x;
    return 1;
}

/* Run entry e on the call's arguments: the result, NULL with an exception set, or
   NotImplemented (new references) for a call the Python path must take. */
static PyObject *run(Entry *e, PyObject *call_args, PyObject *out, const TorchView *views)
{
    void *pointers[PT_MAX_ARGS];
    Scalar scalars[PT_MAX_ARGS];
    for (Py_ssize_t k = 0; k < e->n_params; k++) {
        Param *p = &e->params[k];
        PyObject *a = PyTuple_GET_ITEM(call_args, k);
        if (p->kind == P_TENSOR && views != NULL) {
            PyObject *want = torch_dtype(p);
            if (want == NULL || views[k].dtype != want || !views[k].dense)
                Py_RETURN_NOTIMPLEMENTED;
            pointers[k] = views[k].data;
        } else if (p->kind == P_TENSOR) {
            PyArrayObject *arr = (PyArrayObject *)a;       /* an array: matches() */
            if (!usable(arr, p->descr))
                Py_RETURN_NOTIMPLEMENTED;
            pointers[k] = PyArray_DATA(arr);
        } else {
            if (!scalar(p, a, &scalars[k]))
                Py_RETURN_NOTIMPLEMENTED;
            pointers[k] = &scalars[k];
        }
    }
    /* The outputs: given with out= (one array, or a tuple of one per output), or new. */
    PyObject *given[PT_MAX_ARGS];
    if (out != Py_None) {
        if (e->n_outputs == 1 && PyArray_CheckExact(out)) {
            given[0] = out;
        } else if (PyTuple_CheckExact(out) && PyTuple_GET_SIZE(out) == e->n_outputs) {
            for (Py_ssize_t j = 0; j < e->n_outputs; j++)
                given[j] = PyTuple_GET_ITEM(out, j);
        } else {
            Py_RETURN_NOTIMPLEMENTED;
        }
        for (Py_ssize_t j = 0; j < e->n_outputs; j++) {
            const Output *o = &e->outputs[j];
            if (!PyArray_CheckExact(given[j]))
                Py_RETURN_NOTIMPLEMENTED;
            PyArrayObject *arr = (PyArrayObject *)given[j];
            if (!usable(arr, o->descr) || !PyArray_ISWRITEABLE(arr)
                    || PyArray_NDIM(arr) != o->ndim
                    || memcmp(PyArray_DIMS(arr), o->dims, o->ndim * sizeof(npy_intp)) != 0)
                Py_RETURN_NOTIMPLEMENTED;
            /* restrict pointers: no output may overlap an input or another output */
            for (Py_ssize_t k = 0; k < e->n_params; k++)
                if (e->params[k].kind == P_TENSOR
                        && overlap(arr, (PyArrayObject *)PyTuple_GET_ITEM(call_args, k)))
                    Py_RETURN_NOTIMPLEMENTED;
            for (Py_ssize_t i = 0; i < j; i++)
                if (overlap(arr, (PyArrayObject *)given[i]))
                    Py_RETURN_NOTIMPLEMENTED;
            pointers[e->n_params + j] = PyArray_DATA(arr);
        }
    }
    PyObject *result = NULL;
    PyObject *made[PT_MAX_ARGS];
    Py_ssize_t n_made = 0;
    if (out == Py_None) {
        for (; n_made < e->n_outputs; n_made++) {
            made[n_made] = new_output(&e->outputs[n_made]);
            if (made[n_made] == NULL)
                goto done;
            pointers[e->n_params + n_made] = PyArray_DATA((PyArrayObject *)made[n_made]);
        }
    }
    int64_t err[4] = {0, 0, 0, 0};
    int32_t code;
    Py_BEGIN_ALLOW_THREADS
    code = e->fn(pointers, err);
    Py_END_ALLOW_THREADS
    if (code != 0) {
        PyObject *raised = PyObject_CallFunction(e->fail, "iLLL", (int)code, (long long)err[1],
                                                 (long long)err[2], (long long)err[3]);
        Py_XDECREF(raised);
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "kernel failed with code %d", (int)code);
        goto done;
    }
    /* What the Python path returns: the output, or a tuple of them; torch: a tuple of
       tensors on the outputs' memory. */
    PyObject **outputs = out != Py_None ? given : made;
    if (views != NULL) {
        if ((result = PyTuple_New(e->n_outputs)) == NULL)
            goto done;
        for (Py_ssize_t j = 0; j < e->n_outputs; j++) {
            PyObject *tensor = PyObject_CallOneArg(torch_wrap, outputs[j]);
            if (tensor == NULL) {
                Py_CLEAR(result);
                goto done;
            }
            PyTuple_SET_ITEM(result, j, tensor);
        }
    } else if (e->n_outputs == 1) {
        result = outputs[0];
        Py_INCREF(result);
    } else if ((result = PyTuple_New(e->n_outputs)) != NULL) {
        for (Py_ssize_t j = 0; j < e->n_outputs; j++) {
            Py_INCREF(outputs[j]);
            PyTuple_SET_ITEM(result, j, outputs[j]);
        }
    }
done:
    for (Py_ssize_t j = 0; j < n_made; j++)
        Py_DECREF(made[j]);
    return result;
}

/* dispatcher(args, out=None): the outputs, or NotImplemented. */
static PyObject *dispatcher_call(Dispatcher *self, PyObject *args, PyObject *kwargs)
{
    PyObject *call_args, *out = Py_None;
    static char *names[] = {"args", "out", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!|O", names, &PyTuple_Type, &call_args,
                                     &out))
        return NULL;
    for (Py_ssize_t k = 0; k < self->n_entries; k++) {
        Entry *e = self->entries[k];
        if (e->n_params == PyTuple_GET_SIZE(call_args) && matches(e, call_args)) {
            e->refs++;
            PyObject *result = run(e, call_args, out, NULL);
            entry_release(e);
            return result;
        }
    }
    Py_RETURN_NOTIMPLEMENTED;
}

/* dispatcher.torch(args): the outputs as a tuple of torch tensors, or NotImplemented.
   Tensor parameters take plain CPU tensors (torch.Tensor, nn.Parameter), contiguous,
   of the parameter's dtype, exactly as polytile.torch's address path does. */
static PyObject *dispatcher_torch(Dispatcher *self, PyObject *call_args)
{
    if (!PyTuple_Check(call_args)) {
        PyErr_SetString(PyExc_TypeError, "torch() takes a tuple of arguments");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(call_args);
    if (torch_types == NULL || n > PT_MAX_ARGS)
        Py_RETURN_NOTIMPLEMENTED;
    TorchView views[PT_MAX_ARGS];
    char tensor[PT_MAX_ARGS];
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *a = PyTuple_GET_ITEM(call_args, k);
        tensor[k] = is_torch_tensor(a);
        if (tensor[k] && !torch_view(a, &views[k]))
            Py_RETURN_NOTIMPLEMENTED;
    }
    for (Py_ssize_t k = 0; k < self->n_entries; k++) {
        Entry *e = self->entries[k];
        if (e->n_params != n)
            continue;
        int match = 1;
        for (Py_ssize_t j = 0; match && j < n; j++) {
            const Param *p = &e->params[j];
            if (p->kind == P_TENSOR)
                match = tensor[j] && same_shape(p, views[j].ndim, views[j].dims);
            else if (p->kind == P_INT)
                match = same_integer(p, PyTuple_GET_ITEM(call_args, j));
        }
        if (match) {
            e->refs++;
            PyObject *result = run(e, call_args, Py_None, views);
            entry_release(e);
            return result;
        }
    }
    Py_RETURN_NOTIMPLEMENTED;
}

static Py_ssize_t dispatcher_len(Dispatcher *self)
{
    return self->n_entries;
}

static PyMethodDef dispatcher_methods[] = {
    {"add", (PyCFunction)dispatcher_add, METH_VARARGS,
     "add(address, params, outputs, fail, owner): an entry for one compiled kernel"},
    {"clear", (PyCFunction)dispatcher_clear, METH_NOARGS, "drop every entry"},
    {"torch", (PyCFunction)dispatcher_torch, METH_O,
     "torch(args): the outputs as torch tensors, or NotImplemented"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods dispatcher_sequence = {.sq_length = (lenfunc)dispatcher_len};

static PyTypeObject DispatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_pt_dispatch.Dispatcher",
    .tp_basicsize = sizeof(Dispatcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Dispatcher(): the cached call path of one TC function's kernels",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)dispatcher_dealloc,
    .tp_call = (ternaryfunc)dispatcher_call,
    .tp_methods = dispatcher_methods,
    .tp_as_sequence = &dispatcher_sequence,
};

static PyMethodDef module_methods[] = {
    {"use_torch", (PyCFunction)use_torch, METH_VARARGS,
     "use_torch(tensor_types, wrap, dtype_pairs): let Dispatcher.torch take torch tensors"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef dispatch_module = {
    PyModuleDef_HEAD_INIT,
    .m_methods = module_methods,
    .m_name = "_pt_dispatch",
    .m_doc = "polytile's native call path",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__pt_dispatch(void)
{
    import_array();
    if (PyType_Ready(&DispatcherType) < 0)
        return NULL;
    if ((s_shape = PyUnicode_InternFromString("shape")) == NULL
            || (s_dtype = PyUnicode_InternFromString("dtype")) == NULL
            || (s_is_cpu = PyUnicode_InternFromString("is_cpu")) == NULL
            || (s_is_contiguous = PyUnicode_InternFromString("is_contiguous")) == NULL
            || (s_data_ptr = PyUnicode_InternFromString("data_ptr")) == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&dispatch_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&DispatcherType);
    if (PyModule_AddObject(m, "Dispatcher", (PyObject *)&DispatcherType) < 0) {
        Py_DECREF(&DispatcherType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
