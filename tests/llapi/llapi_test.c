/*
 * llapi_test.c: the Redis module "llapi_test", a client of the low-level C API that the "ai" module exports
 * (include/redisai.h). It uses the API the way a client module does: RedisAI_Initialize in its OnLoad, values read
 * from keys with RedisModule_ModuleTypeGetValue, async runs awaited on a condition variable in the command handler.
 *
 * Each LLAPI.* command runs one group of checks and replies +OK, or an error naming the first check that failed:
 * "ERR check failed: <what> at llapi_test.c:<line>[: <the RedisAI error's text>]". tests/flow/test_llapi.py stores
 * the keys the commands read (a{1}, b{1}, m{1}, m2{1}, myscript{1}, t{1}, tmp{1}, mtmp{1}) and sends the commands.
 * Everything is freed on every path, failed checks included: the module is meant to run under valgrind too.
 *
 *   LLAPI.VERSION          RedisAI_GetLLAPIVersion()
 *   LLAPI.ERRORS           the RAI_Error functions
 *   LLAPI.TENSORS <key>    the tensor functions; <key> holds a tensor set with AI.TENSORSET (t{1})
 *   LLAPI.MODELRUN         model runs: sync, failing, async, batched, from the keyspace, copies, serialization
 *   LLAPI.FAILTHENRUN SYNC|ASYNC   m{1} run without inputs (fails), then with a{1} b{1}: RedisAI's
 *                          test_model_run_async, whose AI.INFO counts the flow test checks
 *   LLAPI.MODELCREATE <graph> <bad blob>   RedisAI_ModelCreate with the TF graph tests/data/tf_mul.pb
 *   LLAPI.SCRIPTRUN        script runs: sync, deprecated adders, input lists, async, ScriptCreate
 *   LLAPI.DAGRUN           DAGs (RedisAI's tests/module/DAG_utils.c tests, and a DAG without model or script)
 *   LLAPI.DAG_MULTIDEVICE  a DAG chaining m{1} (CPU) and m2{1} (CPU:1)
 *   LLAPI.REFCOUNT         copies outlive their keys (deletes tmp{1} and mtmp{1}), run contexts keep references
 *   LLAPI.NULLS            NULL arguments: failure values, no crash
 */
#define REDISMODULE_MAIN
#define REDISAI_MAIN 1
#include "redisai.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ============================================================================================================
 * Checks: the first failed check of a command becomes its error reply. */

#define FAILED_LEN 1024
/* How long a handler waits for an async completion before it gives up (and replies an error, not a hang). */
#define WAIT_SECONDS 60
#define MAX_VALUES 16
#define MAX_OUTPUTS 4

static void record_failure(char *failed, const char *what, const char *file, int line, RAI_Error *err) {
    if (failed[0]) return; /* later failures are consequences of the first */
    const char *base = strrchr(file, '/');
    const char *detail = err ? RedisAI_GetError(err) : NULL;
    int with_detail = detail && detail[0];
    snprintf(failed, FAILED_LEN, "ERR check failed: %s at %s:%d%s%s", what, base ? base + 1 : file, line,
             with_detail ? ": " : "", with_detail ? detail : "");
    /* an error reply is one line; backend errors may have several */
    for (char *p = failed; *p; p++) {
        if (*p == '\r' || *p == '\n') *p = ' ';
    }
}

/* Every test function has `char *failed` and a `cleanup:` label that frees what it holds. */
#define CHECK(cond, what)                                                                                      \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            record_failure(failed, (what), __FILE__, __LINE__, NULL);                                          \
            goto cleanup;                                                                                      \
        }                                                                                                      \
    } while (0)

/* The same, with the text of a RAI_Error appended to the reply (what the API said). */
#define CHECK_ERR(cond, what, err)                                                                             \
    do {                                                                                                       \
        if (!(cond)) {                                                                                         \
            record_failure(failed, (what), __FILE__, __LINE__, (err));                                         \
            goto cleanup;                                                                                      \
        }                                                                                                      \
    } while (0)

static int reply_result(RedisModuleCtx *ctx, const char *failed) {
    if (failed[0]) return RedisModule_ReplyWithError(ctx, failed);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

static int error_is(RAI_Error *err, const char *text) {
    const char *got = RedisAI_GetError(err);
    return got && strcmp(got, text) == 0;
}

static int error_nonempty(RAI_Error *err) {
    const char *got = RedisAI_GetError(err);
    return got && got[0];
}

/* ============================================================================================================
 * Keys and values */

/* The value of `name` if it holds a value of the module type `type`, else NULL. Borrowed from the key, as in
 * RedisAI's own test module: valid while this command runs and nothing changes the key. */
static void *key_value(RedisModuleCtx *ctx, const char *name, RedisModuleType *type) {
    RedisModuleString *s = RedisModule_CreateString(ctx, name, strlen(name));
    RedisModuleKey *key = RedisModule_OpenKey(ctx, s, REDISMODULE_READ);
    void *value = NULL;
    if (key && type && RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_MODULE &&
        RedisModule_ModuleTypeGetType(key) == type) {
        value = RedisModule_ModuleTypeGetValue(key);
    }
    if (key) RedisModule_CloseKey(key);
    RedisModule_FreeString(ctx, s);
    return value;
}

static int key_exists(RedisModuleCtx *ctx, const char *name) {
    RedisModuleString *s = RedisModule_CreateString(ctx, name, strlen(name));
    RedisModuleKey *key = RedisModule_OpenKey(ctx, s, REDISMODULE_READ);
    int exists = key && RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_EMPTY;
    if (key) RedisModule_CloseKey(key);
    RedisModule_FreeString(ctx, s);
    return exists;
}

/* All values of a numeric tensor of at most MAX_VALUES elements: their number, or -1. */
static long read_values(RAI_Tensor *t, double *out) {
    size_t n = RedisAI_TensorLength(t);
    if (n == 0 || n > MAX_VALUES) return -1;
    for (size_t i = 0; i < n; i++) {
        if (RedisAI_TensorGetValueAsDouble(t, (long long)i, &out[i]) != 1) return -1;
    }
    return (long)n;
}

static int same_value(double got, double want) {
    double diff = got > want ? got - want : want - got;
    double scale = want < 0 ? -want : want;
    return diff <= 1e-6 * (scale > 1 ? scale : 1);
}

/* 1 if `t` holds exactly the `n` values `want`. */
static int has_values(RAI_Tensor *t, const double *want, long n) {
    double got[MAX_VALUES];
    if (!t || read_values(t, got) != n) return 0;
    for (long i = 0; i < n; i++) {
        if (!same_value(got[i], want[i])) return 0;
    }
    return 1;
}

#define MAX_DIMS 8

/* 1 if `t` has the shape `dims` (`ndims` of them). */
static int shape_is(RAI_Tensor *t, const long long *dims, int ndims) {
    if (!t || RedisAI_TensorNumDims(t) != ndims) return 0;
    for (int i = 0; i < ndims; i++) {
        if (RedisAI_TensorDim(t, i) != dims[i]) return 0;
    }
    return 1;
}

/* The shape of `t` into dims: the number of dimensions, or -1. */
static int shape_of(RAI_Tensor *t, long long *dims) {
    int n = RedisAI_TensorNumDims(t);
    if (n < 0 || n > MAX_DIMS) return -1;
    for (int i = 0; i < n; i++) dims[i] = RedisAI_TensorDim(t, i);
    return n;
}

/* The tensors a{1} and b{1} (borrowed from their keys) and what the graph and the scripts compute from them:
 * expected values are worked out here from the inputs, whatever values the Python test chose. */
typedef struct Inputs {
    RAI_Tensor *a, *b;
    long long dims[MAX_DIMS]; /* a's shape (b's too) */
    int ndims;
    long n;
    double va[MAX_VALUES], vb[MAX_VALUES];
    double prod[MAX_VALUES]; /* a * b: tf_mul.pb (m{1}, m2{1}) */
    double sum[MAX_VALUES];  /* a + b: bar of myscript{1} */
} Inputs;

static int load_inputs(RedisModuleCtx *ctx, Inputs *in, char *failed) {
    memset(in, 0, sizeof *in);
    in->a = key_value(ctx, "a{1}", RedisAI_TensorRedisType());
    in->b = key_value(ctx, "b{1}", RedisAI_TensorRedisType());
    CHECK(in->a && in->b, "tensors a{1} and b{1} in the keyspace");
    in->n = read_values(in->a, in->va);
    CHECK(in->n > 0, "a{1}'s values read with TensorGetValueAsDouble");
    in->ndims = shape_of(in->a, in->dims);
    CHECK(in->ndims >= 1, "a{1}'s shape");
    CHECK(read_values(in->b, in->vb) == in->n && shape_is(in->b, in->dims, in->ndims), "b{1} read, shaped as a{1}");
    for (long i = 0; i < in->n; i++) {
        in->prod[i] = in->va[i] * in->vb[i];
        in->sum[i] = in->va[i] + in->vb[i];
    }
cleanup:
    return !failed[0];
}

/* ============================================================================================================
 * Async completions. The handler takes st->lock, submits the run, and waits on st->cond until the callback has
 * set `done` (a loop, against spurious wakeups), as RedisAI's tests/module/LLAPI.c does. The lock is an
 * error-checking mutex: a callback called inline, on the handler's own thread, finds it already held by its thread
 * and records that instead of deadlocking. What the callback sees is copied into the state (shallow copies of the
 * outputs, a clone of the error) and checked by the handler afterwards. */

typedef struct Async {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    int calls;
    int inline_call; /* the callback ran on the thread that submitted the run, inside *RunAsync / DAGRun */
    pthread_t thread;
    int probe;           /* also ask for the finish context as the wrong kind (must be refused) */
    void *probe_ctx;     /* what that returned */
    RedisAI_ErrorCode probe_code;
    int internal_error;  /* the callback could not do its own bookkeeping (InitError failed) */
    void *run_ctx;       /* GetAsModelRunCtx / GetAsScriptRunCtx */
    RAI_Error *err;      /* the run's error, as the callback got it */
    int run_error;       /* DAGRunError */
    int dag_error_null;  /* DAGRunError was set but DAGGetError returned NULL */
    size_t n_outputs;
    RAI_Tensor *outputs[MAX_OUTPUTS]; /* shallow copies, taken in the callback */
    int null_output;     /* an output below n_outputs was NULL */
    int past_end_null;   /* the output at index n_outputs was NULL */
} Async;

static void async_free(Async *st) {
    if (!st) return;
    for (size_t i = 0; i < MAX_OUTPUTS; i++) {
        if (st->outputs[i]) RedisAI_TensorFree(st->outputs[i]);
    }
    if (st->err) RedisAI_FreeError(st->err);
    pthread_mutex_destroy(&st->lock);
    pthread_cond_destroy(&st->cond);
    RedisModule_Free(st);
}

static Async *async_new(void) {
    Async *st = RedisModule_Calloc(1, sizeof *st);
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&st->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_cond_init(&st->cond, NULL);
    if (RedisAI_InitError(&st->err) != REDISMODULE_OK || !st->err) {
        st->err = NULL;
        async_free(st);
        return NULL;
    }
    return st;
}

/* Last thing a callback does. */
static void async_finish(Async *st) {
    int rc = pthread_mutex_lock(&st->lock);
    st->thread = pthread_self();
    st->calls++;
    st->done = 1;
    if (rc == EDEADLK) { /* the submitting thread holds the lock: we are inside its *RunAsync call */
        st->inline_call = 1;
        return;
    }
    pthread_cond_signal(&st->cond);
    pthread_mutex_unlock(&st->lock);
}

static void collect_output(Async *st, size_t i, const RAI_Tensor *t) {
    if (!t) {
        st->null_output = 1;
    } else if (i < MAX_OUTPUTS) {
        st->outputs[i] = RedisAI_TensorGetShallowCopy((RAI_Tensor *)t);
    }
}

/* The callback of a model (model = 1) or script run: first, if asked, a probe of the other kind (refused), then
 * the run context, its error and its outputs (kept as shallow copies). */
static void ctx_run_done(RAI_OnFinishCtx *fctx, Async *st, int model) {
    if (st->probe) { /* before GetAs*RunCtx, which may release the finish context (RedisAI does) */
        RAI_Error *e = NULL;
        if (RedisAI_InitError(&e) == REDISMODULE_OK && e) {
            st->probe_ctx = model ? (void *)RedisAI_GetAsScriptRunCtx(fctx, e) : (void *)RedisAI_GetAsModelRunCtx(fctx, e);
            st->probe_code = RedisAI_GetErrorCode(e);
            RedisAI_FreeError(e);
        } else {
            st->internal_error = 1;
        }
    }
    RAI_ModelRunCtx *mctx = model ? RedisAI_GetAsModelRunCtx(fctx, st->err) : NULL;
    RAI_ScriptRunCtx *sctx = model ? NULL : RedisAI_GetAsScriptRunCtx(fctx, st->err);
    st->run_ctx = model ? (void *)mctx : (void *)sctx;
    if (st->run_ctx && RedisAI_GetErrorCode(st->err) == RedisAI_ErrorCode_OK) {
        st->n_outputs = model ? RedisAI_ModelRunCtxNumOutputs(mctx) : RedisAI_ScriptRunCtxNumOutputs(sctx);
        for (size_t i = 0; i <= st->n_outputs; i++) {
            RAI_Tensor *t = model ? RedisAI_ModelRunCtxOutputTensor(mctx, i) : RedisAI_ScriptRunCtxOutputTensor(sctx, i);
            if (i < st->n_outputs) {
                collect_output(st, i, t);
            } else {
                st->past_end_null = t == NULL;
            }
        }
    }
    async_finish(st);
}

static void model_run_done(RAI_OnFinishCtx *fctx, void *private_data) { ctx_run_done(fctx, private_data, 1); }

static void script_run_done(RAI_OnFinishCtx *fctx, void *private_data) { ctx_run_done(fctx, private_data, 0); }

/* The DAG callback of RedisAI's DAG_utils.c: the error cloned, or every output kept as a shallow copy (what
 * DAGOutputTensor returns is valid only during the callback). */
static void dag_done(RAI_OnFinishCtx *fctx, void *private_data) {
    Async *st = private_data;
    st->run_error = RedisAI_DAGRunError(fctx);
    if (st->run_error) {
        const RAI_Error *e = RedisAI_DAGGetError(fctx);
        if (e) {
            RedisAI_CloneError(st->err, e);
        } else {
            st->dag_error_null = 1;
        }
    } else {
        st->n_outputs = RedisAI_DAGNumOutputs(fctx);
        for (size_t i = 0; i < st->n_outputs; i++) collect_output(st, i, RedisAI_DAGOutputTensor(fctx, i));
        st->past_end_null = RedisAI_DAGOutputTensor(fctx, st->n_outputs) == NULL;
    }
    if (st->probe) { /* a DAG's finish context is not a model run's */
        RAI_Error *e = NULL;
        if (RedisAI_InitError(&e) == REDISMODULE_OK && e) {
            st->probe_ctx = RedisAI_GetAsModelRunCtx(fctx, e);
            st->probe_code = RedisAI_GetErrorCode(e);
            RedisAI_FreeError(e);
        } else {
            st->internal_error = 1;
        }
    }
    async_finish(st);
}

/* The callback of runs that must be refused before they start. It touches nothing but this counter, so that a
 * wrong late call cannot write into freed memory; LLAPI.DAGRUN and LLAPI.NULLS check it stayed 0. */
static int unexpected_callbacks;

static void must_not_run(RAI_OnFinishCtx *fctx, void *private_data) {
    (void)fctx;
    (void)private_data;
    __atomic_add_fetch(&unexpected_callbacks, 1, __ATOMIC_SEQ_CST);
}

static int no_unexpected_callbacks(void) { return __atomic_load_n(&unexpected_callbacks, __ATOMIC_SEQ_CST) == 0; }

/* Waits (st->lock held since before the run was submitted) for the callback and checks that it ran once, on
 * another thread. After WAIT_SECONDS without it, *stp is set to NULL: the state is leaked on purpose, since the
 * callback may still come and write into it (the caller leaks the run context for the same reason). */
static int await_callback(Async **stp, char *failed, int line) {
    Async *st = *stp;
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += WAIT_SECONDS;
    while (!st->done) {
        if (pthread_cond_timedwait(&st->cond, &st->lock, &deadline) == ETIMEDOUT) break;
    }
    int done = st->done;
    pthread_mutex_unlock(&st->lock);
    if (!done) {
        *stp = NULL;
        record_failure(failed, "completion callback called within WAIT_SECONDS", __FILE__, line, NULL);
        return 0;
    }
    if (st->inline_call) {
        record_failure(failed, "completion callback not called on the caller's thread, inside the submit call",
                       __FILE__, line, NULL);
        return 0;
    }
    if (st->calls != 1 || pthread_equal(st->thread, pthread_self())) {
        record_failure(failed, "completion callback called once, on another thread than the caller's", __FILE__,
                       line, NULL);
        return 0;
    }
    if (st->internal_error) {
        record_failure(failed, "InitError inside the completion callback", __FILE__, line, NULL);
        return 0;
    }
    return 1;
}

/* ============================================================================================================
 * Model run contexts */

/* A run context of `model` with the inputs a, b (the names of tf_mul.pb) and the output c. */
static RAI_ModelRunCtx *mul_ctx(RAI_Model *model, RAI_Tensor *a, RAI_Tensor *b, char *failed, int line) {
    RAI_ModelRunCtx *mctx = RedisAI_ModelRunCtxCreate(model);
    if (!mctx) {
        record_failure(failed, "ModelRunCtxCreate", __FILE__, line, NULL);
        return NULL;
    }
    if (RedisAI_ModelRunCtxAddInput(mctx, "a", a) != 1 || RedisAI_ModelRunCtxAddInput(mctx, "b", b) != 1 ||
        RedisAI_ModelRunCtxAddOutput(mctx, "c") != 1) {
        record_failure(failed, "ModelRunCtxAddInput / ModelRunCtxAddOutput return 1", __FILE__, line, NULL);
        RedisAI_ModelRunCtxFree(mctx);
        return NULL;
    }
    return mctx;
}

/* Runs a context made by mul_ctx synchronously; its single output must hold `want`, shaped `dims`. */
static int run_mul_sync(RAI_ModelRunCtx *mctx, const double *want, long n, const long long *dims, int ndims,
                        char *failed, int line) {
    RAI_Error *err = NULL;
    int ok = 0;
    if (RedisAI_InitError(&err) != REDISMODULE_OK || !err) {
        record_failure(failed, "InitError", __FILE__, line, NULL);
        return 0;
    }
    if (RedisAI_ModelRun(&mctx, 1, err) != REDISMODULE_OK) {
        record_failure(failed, "ModelRun (sync) returned REDISMODULE_OK", __FILE__, line, err);
    } else if (RedisAI_GetErrorCode(err) != RedisAI_ErrorCode_OK) {
        record_failure(failed, "no error code after a successful ModelRun", __FILE__, line, err);
    } else if (RedisAI_ModelRunCtxNumOutputs(mctx) != 1) {
        record_failure(failed, "ModelRunCtxNumOutputs == 1 after the run", __FILE__, line, NULL);
    } else if (!has_values(RedisAI_ModelRunCtxOutputTensor(mctx, 0), want, n)) {
        record_failure(failed, "the run's output holds the expected values", __FILE__, line, NULL);
    } else if (!shape_is(RedisAI_ModelRunCtxOutputTensor(mctx, 0), dims, ndims)) {
        record_failure(failed, "the run's output has the inputs' shape", __FILE__, line, NULL);
    } else {
        ok = 1;
    }
    RedisAI_FreeError(err);
    return ok;
}

/* ============================================================================================================
 * LLAPI.VERSION */

static int cmd_version(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RedisModule_WrongArity(ctx);
    return RedisModule_ReplyWithLongLong(ctx, RedisAI_GetLLAPIVersion());
}

/* ============================================================================================================
 * LLAPI.ERRORS */

static int test_errors(RedisModuleCtx *ctx, char *failed) {
    RAI_Error *err = NULL, *copy = NULL;
    RedisModuleString *nokey = NULL;
    RAI_Model *model = NULL, *found = NULL;
    char saved[512];
    char cpu[] = "CPU", tag[] = "";
    const char *ins[] = {"a", "b"}, *outs[] = {"c"};
    RAI_ModelOpts opts;
    memset(&opts, 0, sizeof opts);

    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError returns REDISMODULE_OK and an error");
    CHECK(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "a new error's code is RedisAI_ErrorCode_OK");
    const char *text = RedisAI_GetError(err);
    CHECK(text && text[0] == '\0', "GetError is \"\" (not NULL) while there is no error");
    const char *one = RedisAI_GetErrorOneLine(err);
    CHECK(!one || one[0] == '\0', "GetErrorOneLine is empty while there is no error");

    /* an error set by a failing call */
    model = RedisAI_ModelCreate(REDISAI_BACKEND_ONNXRUNTIME, cpu, tag, opts, 2, ins, 1, outs, "not a graph", 11, err);
    CHECK(model == NULL, "ModelCreate refuses a blob that is no ONNX model");
    RedisAI_ErrorCode code = RedisAI_GetErrorCode(err);
    CHECK(code != RedisAI_ErrorCode_OK, "a failed ModelCreate sets an error code");
    CHECK(error_nonempty(err), "a failed ModelCreate sets an error text");
    one = RedisAI_GetErrorOneLine(err);
    CHECK(one && one[0] && !strchr(one, '\n') && !strchr(one, '\r'), "GetErrorOneLine is non-empty, one line");
    snprintf(saved, sizeof saved, "%s", RedisAI_GetError(err));

    CHECK(RedisAI_InitError(&copy) == REDISMODULE_OK && copy, "InitError of a second error");
    RedisAI_CloneError(copy, err);
    CHECK(RedisAI_GetErrorCode(copy) == code, "CloneError copies the code");
    CHECK(error_is(copy, saved), "CloneError copies the text");

    RedisAI_ClearError(err);
    CHECK(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "ClearError resets the code to OK");
    text = RedisAI_GetError(err);
    CHECK(text && text[0] == '\0', "GetError is \"\" after ClearError");
    CHECK(RedisAI_GetErrorCode(copy) == code && error_is(copy, saved), "a clone is unchanged by clearing its source");

    /* a second failure in a cleared error; cloned over an existing error, it replaces it */
    nokey = RedisModule_CreateString(ctx, "nokey{1}", 8);
    CHECK(RedisAI_GetModelFromKeyspace(ctx, nokey, &found, REDISMODULE_READ, err) == REDISMODULE_ERR,
          "GetModelFromKeyspace of a missing key fails");
    CHECK(error_is(err, "ERR model key is empty"), "a cleared error takes a new error's text");
    RedisAI_CloneError(copy, err);
    CHECK(error_is(copy, "ERR model key is empty") && RedisAI_GetErrorCode(copy) == RedisAI_GetErrorCode(err),
          "CloneError into an error that holds one replaces it");

cleanup:
    if (nokey) RedisModule_FreeString(ctx, nokey);
    if (model) RedisAI_ModelFree(model, NULL);
    if (err) RedisAI_FreeError(err);
    if (copy) RedisAI_FreeError(copy);
    return !failed[0];
}

static int cmd_errors(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    test_errors(ctx, failed);
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.TENSORS <key> */

static int test_tensor_create(char *failed) {
    RAI_Tensor *t = NULL, *f1 = NULL, *i64 = NULL;
    long long dims[] = {2, 2}, bad_dims[] = {2, -1}, one[] = {1}, three[] = {3};
    static const char zeros[16] = {0};

    CHECK(RedisAI_TensorCreate("INVALID", dims, 2) == NULL, "TensorCreate(\"INVALID\") is NULL");
    CHECK(RedisAI_TensorCreate("FLOAT", bad_dims, 2) == NULL, "TensorCreate with a negative dimension is NULL");
    t = RedisAI_TensorCreate("FLOAT", dims, 2);
    CHECK(t, "TensorCreate(\"FLOAT\", {2, 2})");
    CHECK(RedisAI_TensorData(t) && memcmp(RedisAI_TensorData(t), zeros, 16) == 0, "a new tensor is zero-filled");
    CHECK(RedisAI_TensorLength(t) == 4, "TensorLength == 4");
    CHECK(RedisAI_TensorNumDims(t) == 2, "TensorNumDims == 2");
    CHECK(RedisAI_TensorDim(t, 0) == 2 && RedisAI_TensorDim(t, 1) == 2, "TensorDim == 2, 2");
    CHECK(RedisAI_TensorDim(t, 5) == -1 && RedisAI_TensorDim(t, 2) == -1 && RedisAI_TensorDim(t, -1) == -1,
          "TensorDim out of range is -1");
    CHECK(RedisAI_TensorByteSize(t) == 16, "TensorByteSize == 16");
    CHECK(RedisAI_TensorDataSize(t) == 4, "TensorDataSize of FLOAT == 4");

    f1 = RedisAI_TensorCreate("FLOAT", one, 1);
    i64 = RedisAI_TensorCreate("INT64", three, 1);
    CHECK(f1 && i64, "TensorCreate FLOAT {1} and INT64 {3}");
    CHECK(RedisAI_TensorDataType(t) != 0 && RedisAI_TensorDataType(t) == RedisAI_TensorDataType(f1),
          "TensorDataType is the same (non-zero) for two FLOAT tensors");
    CHECK(RedisAI_TensorDataType(t) != RedisAI_TensorDataType(i64), "TensorDataType differs for FLOAT and INT64");
    CHECK(RedisAI_TensorDataSize(i64) == 8 && RedisAI_TensorByteSize(i64) == 24, "INT64 {3}: 8 bytes each, 24");
    CHECK(RedisAI_TensorNumDims(i64) == 1 && RedisAI_TensorDim(i64, 0) == 3, "INT64 {3}: one dimension of 3");

cleanup:
    if (t) RedisAI_TensorFree(t);
    if (f1) RedisAI_TensorFree(f1);
    if (i64) RedisAI_TensorFree(i64);
    return !failed[0];
}

static int test_tensor_values(char *failed) {
    RAI_Tensor *f = NULL, *i = NULL;
    long long dims[] = {2, 2};
    double d = 0;
    long long ll = 0;
    const float data[4] = {1.5f, -2.0f, 3.0f, 4.25f};
    const double want[4] = {1.5, -2.0, 3.0, 4.25};

    f = RedisAI_TensorCreate("FLOAT", dims, 2);
    i = RedisAI_TensorCreate("INT64", dims, 2);
    CHECK(f && i, "TensorCreate FLOAT and INT64 {2, 2}");
    CHECK(RedisAI_TensorSetValueFromDouble(f, 3, 2.5) == 1, "TensorSetValueFromDouble returns 1");
    CHECK(RedisAI_TensorGetValueAsDouble(f, 3, &d) == 1 && d == 2.5, "TensorGetValueAsDouble reads it back");
    CHECK(RedisAI_TensorSetValueFromLongLong(i, 2, (1LL << 40) + 3) == 1, "TensorSetValueFromLongLong returns 1");
    CHECK(RedisAI_TensorGetValueAsLongLong(i, 2, &ll) == 1 && ll == (1LL << 40) + 3,
          "TensorGetValueAsLongLong reads it back");
    CHECK(RedisAI_TensorSetValueFromLongLong(i, 0, -7) == 1 && RedisAI_TensorGetValueAsLongLong(i, 0, &ll) == 1 &&
              ll == -7,
          "a negative INT64 round trip");
    CHECK(RedisAI_TensorSetValueFromDouble(f, 4, 1.0) == 0 && RedisAI_TensorSetValueFromDouble(f, -1, 1.0) == 0,
          "TensorSetValueFromDouble out of range returns 0");
    CHECK(RedisAI_TensorSetValueFromLongLong(i, 4, 1) == 0, "TensorSetValueFromLongLong out of range returns 0");
    CHECK(RedisAI_TensorGetValueAsDouble(f, 4, &d) == 0 && RedisAI_TensorGetValueAsDouble(f, -1, &d) == 0,
          "TensorGetValueAsDouble out of range returns 0");
    CHECK(RedisAI_TensorGetValueAsLongLong(i, 4, &ll) == 0, "TensorGetValueAsLongLong out of range returns 0");

    CHECK(RedisAI_TensorSetData(f, (const char *)data, 12) == 0, "TensorSetData with 12 bytes for 16 returns 0");
    CHECK(RedisAI_TensorSetData(f, (const char *)data, 20) == 0, "TensorSetData with 20 bytes for 16 returns 0");
    CHECK(RedisAI_TensorSetData(f, (const char *)data, 16) == 1, "TensorSetData with 16 bytes returns 1");
    CHECK(has_values(f, want, 4), "the values set by TensorSetData read back");
    CHECK(memcmp(RedisAI_TensorData(f), data, 16) == 0, "TensorData holds the bytes set");

cleanup:
    if (f) RedisAI_TensorFree(f);
    if (i) RedisAI_TensorFree(i);
    return !failed[0];
}

static int test_tensor_bool_string(char *failed) {
    RAI_Tensor *b = NULL, *s = NULL;
    long long dims[] = {1, 4};
    const unsigned char bad_bools[4] = {2, 0, 0, 0}, bools[4] = {1, 0, 1, 0};
    static const char one_string[] = "only one string"; /* sizeof counts its '\0' */
    static const char strings[] = "first\0second\0third\0forth";
    long long ll = -1;

    b = RedisAI_TensorCreate("BOOL", dims, 2);
    CHECK(b, "TensorCreate(\"BOOL\", {1, 4})");
    CHECK(RedisAI_TensorSetData(b, (const char *)bad_bools, 4) == 0, "TensorSetData refuses 2 in a BOOL tensor");
    CHECK(RedisAI_TensorSetData(b, (const char *)bools, 4) == 1, "TensorSetData takes {1, 0, 1, 0} for BOOL");
    CHECK(memcmp(RedisAI_TensorData(b), bools, 4) == 0, "the BOOL data reads back");
    CHECK(RedisAI_TensorGetValueAsLongLong(b, 2, &ll) == 1 && ll == 1, "a BOOL value as long long");

    s = RedisAI_TensorCreate("STRING", dims, 2);
    CHECK(s, "TensorCreate(\"STRING\", {1, 4})");
    CHECK(RedisAI_TensorSetData(s, one_string, sizeof one_string) == 0,
          "TensorSetData refuses one string for a STRING tensor of 4");
    CHECK(RedisAI_TensorSetData(s, one_string, sizeof one_string - 1) == 0,
          "TensorSetData refuses STRING data without a final '\\0'");
    CHECK(sizeof strings == 25, "the test's own STRING blob is 25 bytes");
    CHECK(RedisAI_TensorSetData(s, strings, sizeof strings) == 1, "TensorSetData takes 4 strings for 4");
    CHECK(memcmp(RedisAI_TensorData(s), strings, sizeof strings) == 0, "the STRING data reads back");

cleanup:
    if (b) RedisAI_TensorFree(b);
    if (s) RedisAI_TensorFree(s);
    return !failed[0];
}

static int test_tensor_concat_slice(char *failed) {
    RAI_Tensor *s1 = NULL, *s2 = NULL, *sb = NULL, *sl1 = NULL, *sl2 = NULL;
    RAI_Tensor *f = NULL, *fb = NULL, *fs = NULL, *i = NULL, *f3 = NULL;
    long long d14[] = {1, 4}, d24[] = {2, 4}, d22[] = {2, 2}, d23[] = {2, 3};
    static const char data1[] = "first\0second\0third\0forth";   /* 25 bytes */
    static const char data2[] = "A\0B\0C\0D\0E\0F\0G\0H";          /* 16 bytes */
    static const char batched[] = "first\0second\0third\0forth\0A\0B\0C\0D\0E\0F\0G\0H";
    const float fdata[4] = {1.5f, -2.0f, 3.0f, 4.25f};
    const double fb_want[8] = {1.5, -2, 3, 4.25, 1.5, -2, 3, 4.25};
    const double fs_want[4] = {3, 4.25, 1.5, -2};

    /* STRING: [1,4] + [2,4] -> [3,4], then sliced back */
    s1 = RedisAI_TensorCreate("STRING", d14, 2);
    s2 = RedisAI_TensorCreate("STRING", d24, 2);
    CHECK(s1 && s2, "TensorCreate STRING {1, 4} and {2, 4}");
    CHECK(RedisAI_TensorSetData(s1, data1, sizeof data1) == 1 && RedisAI_TensorSetData(s2, data2, sizeof data2) == 1,
          "TensorSetData of the STRING tensors");
    RAI_Tensor *strs[] = {s1, s2};
    sb = RedisAI_TensorCreateByConcatenatingTensors(strs, 2);
    CHECK(sb, "TensorCreateByConcatenatingTensors of two STRING tensors");
    CHECK(RedisAI_TensorNumDims(sb) == 2 && RedisAI_TensorDim(sb, 0) == 3 && RedisAI_TensorDim(sb, 1) == 4,
          "the concatenation is [3, 4]");
    CHECK(RedisAI_TensorLength(sb) == 12, "the concatenation has 12 elements");
    CHECK(memcmp(RedisAI_TensorData(sb), batched, sizeof batched) == 0, "the concatenation's data is both blobs");

    sl1 = RedisAI_TensorCreateBySlicingTensor(sb, 0, 1);
    sl2 = RedisAI_TensorCreateBySlicingTensor(sb, 1, 2);
    CHECK(sl1 && sl2, "TensorCreateBySlicingTensor (0, 1) and (1, 2)");
    CHECK(RedisAI_TensorNumDims(sl1) == 2 && RedisAI_TensorDim(sl1, 0) == 1 && RedisAI_TensorDim(sl1, 1) == 4 &&
              memcmp(RedisAI_TensorData(sl1), data1, sizeof data1) == 0,
          "slice (0, 1) is the first tensor");
    CHECK(RedisAI_TensorNumDims(sl2) == 2 && RedisAI_TensorDim(sl2, 0) == 2 && RedisAI_TensorDim(sl2, 1) == 4 &&
              memcmp(RedisAI_TensorData(sl2), data2, sizeof data2) == 0,
          "slice (1, 2) is the second tensor");
    CHECK(RedisAI_TensorCreateBySlicingTensor(sb, 2, 2) == NULL, "a slice past the end is NULL");
    CHECK(RedisAI_TensorCreateBySlicingTensor(sb, 3, 1) == NULL, "a slice starting at the end is NULL");
    CHECK(RedisAI_TensorCreateBySlicingTensor(sb, -1, 1) == NULL, "a slice at a negative offset is NULL");

    /* FLOAT: [2,2] + [2,2] -> [4,2]; rows 1..2 of it */
    f = RedisAI_TensorCreate("FLOAT", d22, 2);
    CHECK(f && RedisAI_TensorSetData(f, (const char *)fdata, 16) == 1, "a FLOAT {2, 2} tensor");
    RAI_Tensor *floats[] = {f, f};
    fb = RedisAI_TensorCreateByConcatenatingTensors(floats, 2);
    CHECK(fb && RedisAI_TensorDim(fb, 0) == 4 && RedisAI_TensorDim(fb, 1) == 2 && has_values(fb, fb_want, 8),
          "a FLOAT tensor concatenated with itself");
    fs = RedisAI_TensorCreateBySlicingTensor(fb, 1, 2);
    CHECK(fs && RedisAI_TensorDim(fs, 0) == 2 && RedisAI_TensorDim(fs, 1) == 2 && has_values(fs, fs_want, 4),
          "rows 1 and 2 of the FLOAT concatenation");

    /* tensors that do not concatenate */
    i = RedisAI_TensorCreate("INT64", d22, 2);
    f3 = RedisAI_TensorCreate("FLOAT", d23, 2);
    CHECK(i && f3, "TensorCreate INT64 {2, 2} and FLOAT {2, 3}");
    RAI_Tensor *mixed[] = {f, i}, *shapes[] = {f, f3};
    CHECK(RedisAI_TensorCreateByConcatenatingTensors(mixed, 2) == NULL, "concatenating FLOAT and INT64 is NULL");
    /* RedisAI did not check this (and overran its buffer); NULL is the only sound answer */
    CHECK(RedisAI_TensorCreateByConcatenatingTensors(shapes, 2) == NULL,
          "concatenating [2, 2] and [2, 3] is NULL");

cleanup:;
    RAI_Tensor *all[] = {s1, s2, sb, sl1, sl2, f, fb, fs, i, f3};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) {
        if (all[k]) RedisAI_TensorFree(all[k]);
    }
    return !failed[0];
}

static int test_tensor_copies(char *failed) {
    RAI_Tensor *t = NULL, *c = NULL;
    long long dims[] = {2, 2};
    const float data[4] = {1.5f, -2.0f, 3.0f, 4.25f};
    const double want[4] = {1.5, -2.0, 3.0, 4.25};

    /* the original freed first: the copy's reference keeps the data */
    t = RedisAI_TensorCreate("FLOAT", dims, 2);
    CHECK(t && RedisAI_TensorSetData(t, (const char *)data, 16) == 1, "a FLOAT {2, 2} tensor");
    c = RedisAI_TensorGetShallowCopy(t);
    CHECK(c, "TensorGetShallowCopy");
    RedisAI_TensorFree(t);
    t = NULL;
    CHECK(has_values(c, want, 4) && RedisAI_TensorDim(c, 0) == 2, "a copy reads after the original is freed");
    RedisAI_TensorFree(c);
    c = NULL;

    /* the copy freed first */
    t = RedisAI_TensorCreate("FLOAT", dims, 2);
    CHECK(t && RedisAI_TensorSetData(t, (const char *)data, 16) == 1, "a second FLOAT {2, 2} tensor");
    c = RedisAI_TensorGetShallowCopy(t);
    CHECK(c, "TensorGetShallowCopy of the second tensor");
    RedisAI_TensorFree(c);
    c = NULL;
    CHECK(has_values(t, want, 4), "the original reads after its copy is freed");

cleanup:
    if (t) RedisAI_TensorFree(t);
    if (c) RedisAI_TensorFree(c);
    return !failed[0];
}

static int test_tensor_key(RedisModuleCtx *ctx, RedisModuleString *keyname, char *failed) {
    RedisModuleKey *key = NULL;
    const double want[4] = {1, 2, 3, 4}; /* t{1} as test_llapi.py sets it */

    CHECK(RedisAI_TensorRedisType() != NULL, "TensorRedisType is not NULL");
    key = RedisModule_OpenKey(ctx, keyname, REDISMODULE_READ);
    CHECK(key && RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_MODULE, "the key given holds a module value");
    CHECK(RedisModule_ModuleTypeGetType(key) == RedisAI_TensorRedisType(),
          "a key set with AI.TENSORSET has the type TensorRedisType");
    RAI_Tensor *t = RedisModule_ModuleTypeGetValue(key);
    CHECK(t && has_values(t, want, 4) && RedisAI_TensorNumDims(t) == 2 && RedisAI_TensorDim(t, 0) == 2,
          "the key's tensor reads through the API: FLOAT [2, 2] 1 2 3 4");

cleanup:
    if (key) RedisModule_CloseKey(key);
    return !failed[0];
}

/* The NULL arguments of the tensor functions; the rest are in LLAPI.NULLS. */
static int test_tensor_nulls(char *failed) {
    double d = 0;
    CHECK(RedisAI_TensorLength(NULL) == 0, "TensorLength(NULL) == 0");
    RedisAI_TensorFree(NULL);
    CHECK(RedisAI_TensorGetShallowCopy(NULL) == NULL, "TensorGetShallowCopy(NULL) is NULL");
    CHECK(RedisAI_TensorData(NULL) == NULL, "TensorData(NULL) is NULL");
    CHECK(RedisAI_TensorGetValueAsDouble(NULL, 0, &d) == 0, "TensorGetValueAsDouble(NULL) returns 0");
cleanup:
    return !failed[0];
}

static int cmd_tensors(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 2) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    (void)(test_tensor_create(failed) && test_tensor_values(failed) && test_tensor_bool_string(failed) &&
           test_tensor_concat_slice(failed) && test_tensor_copies(failed) &&
           test_tensor_key(ctx, argv[1], failed) && test_tensor_nulls(failed));
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.MODELRUN */

/* (a) sync; outputs belong to the context, and a shallow copy of one outlives it */
static int mr_sync(Inputs *in, RAI_Model *model, char *failed) {
    RAI_ModelRunCtx *mctx = NULL;
    RAI_Tensor *kept = NULL;
    mctx = mul_ctx(model, in->a, in->b, failed, __LINE__);
    CHECK(mctx, "run context of m{1}");
    CHECK(run_mul_sync(mctx, in->prod, in->n, in->dims, in->ndims, failed, __LINE__), "sync run of m{1}: c == a * b");
    CHECK(RedisAI_ModelRunCtxOutputTensor(mctx, 1) == NULL, "ModelRunCtxOutputTensor past the last output is NULL");
    kept = RedisAI_TensorGetShallowCopy(RedisAI_ModelRunCtxOutputTensor(mctx, 0));
    CHECK(kept, "TensorGetShallowCopy of an output");
    RedisAI_ModelRunCtxFree(mctx);
    mctx = NULL;
    CHECK(has_values(kept, in->prod, in->n), "an output's copy outlives its run context");
cleanup:
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    if (kept) RedisAI_TensorFree(kept);
    return !failed[0];
}

/* (b) sync without inputs */
static int mr_sync_no_inputs(RAI_Model *model, char *failed) {
    RAI_ModelRunCtx *mctx = NULL;
    RAI_Error *err = NULL;
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    mctx = RedisAI_ModelRunCtxCreate(model);
    CHECK(mctx && RedisAI_ModelRunCtxAddOutput(mctx, "c") == 1, "run context of m{1} with an output only");
    CHECK(RedisAI_ModelRun(&mctx, 1, err) == REDISMODULE_ERR, "ModelRun without inputs returns REDISMODULE_ERR");
    CHECK(RedisAI_GetErrorCode(err) != RedisAI_ErrorCode_OK && error_nonempty(err),
          "ModelRun without inputs sets an error");
cleanup:
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

/* (c) async: the callback gets the submitted context back, with its output, on a worker thread */
static int mr_async(Inputs *in, RAI_Model *model, char *failed) {
    RAI_ModelRunCtx *mctx = NULL;
    Async *st = async_new();
    CHECK(st, "async state (InitError)");
    st->probe = 1;
    mctx = mul_ctx(model, in->a, in->b, failed, __LINE__);
    CHECK(mctx, "run context of m{1}");
    pthread_mutex_lock(&st->lock);
    if (RedisAI_ModelRunAsync(mctx, model_run_done, st) != REDISMODULE_OK) {
        pthread_mutex_unlock(&st->lock);
        CHECK(0, "ModelRunAsync returns REDISMODULE_OK");
    }
    if (!await_callback(&st, failed, __LINE__)) {
        if (!st) mctx = NULL; /* still in use by the run: leaked with the state */
        goto cleanup;
    }
    CHECK(st->run_ctx == mctx, "GetAsModelRunCtx returns the context given to ModelRunAsync");
    CHECK_ERR(RedisAI_GetErrorCode(st->err) == RedisAI_ErrorCode_OK, "GetAsModelRunCtx: no error", st->err);
    CHECK(st->n_outputs == 1 && !st->null_output, "the callback sees 1 output");
    CHECK(has_values(st->outputs[0], in->prod, in->n), "the callback's output is a * b");
    CHECK(st->past_end_null, "ModelRunCtxOutputTensor past the last output is NULL (in the callback)");
    CHECK(st->probe_ctx == NULL && st->probe_code == RedisAI_ErrorCode_EFINISHCTX,
          "GetAsScriptRunCtx of a model run's finish context: NULL, EFINISHCTX");
    CHECK(has_values(RedisAI_ModelRunCtxOutputTensor(mctx, 0), in->prod, in->n),
          "the context keeps its output after the callback");
cleanup:
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    async_free(st);
    return !failed[0];
}

/* (d) async without inputs: the error reaches the callback */
static int mr_async_no_inputs(RAI_Model *model, char *failed) {
    RAI_ModelRunCtx *mctx = NULL;
    Async *st = async_new();
    CHECK(st, "async state (InitError)");
    mctx = RedisAI_ModelRunCtxCreate(model);
    CHECK(mctx && RedisAI_ModelRunCtxAddOutput(mctx, "c") == 1, "run context of m{1} with an output only");
    pthread_mutex_lock(&st->lock);
    if (RedisAI_ModelRunAsync(mctx, model_run_done, st) != REDISMODULE_OK) {
        pthread_mutex_unlock(&st->lock);
        CHECK(0, "ModelRunAsync of a run that will fail still returns REDISMODULE_OK");
    }
    if (!await_callback(&st, failed, __LINE__)) {
        if (!st) mctx = NULL;
        goto cleanup;
    }
    CHECK(RedisAI_GetErrorCode(st->err) == RedisAI_ErrorCode_EMODELRUN && error_nonempty(st->err),
          "GetAsModelRunCtx of a run without inputs: EMODELRUN with a text");
    CHECK(st->run_ctx == mctx, "GetAsModelRunCtx returns the submitted context on an error too (as RedisAI)");
cleanup:
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    async_free(st);
    return !failed[0];
}

/* (d2) a synchronous run asked for inside a completion callback, on one of the module's worker threads, is
 * refused with an error instead of waiting for the queue that thread serves (redisai-rs; RedisAI deadlocked) */
typedef struct Nested {
    Async *st;
    RAI_Model *model;
    Inputs *in;
    int status;
    char text[256];
} Nested;

static void nested_sync_done(RAI_OnFinishCtx *fctx, void *private_data) {
    Nested *n = private_data;
    RAI_Error *e = NULL;
    RAI_ModelRunCtx *inner = RedisAI_ModelRunCtxCreate(n->model);
    if (RedisAI_InitError(&e) == REDISMODULE_OK && e && inner) {
        RedisAI_ModelRunCtxAddInput(inner, "a", n->in->a);
        RedisAI_ModelRunCtxAddInput(inner, "b", n->in->b);
        RedisAI_ModelRunCtxAddOutput(inner, "c");
        n->status = RedisAI_ModelRun(&inner, 1, e);
        snprintf(n->text, sizeof n->text, "%s", RedisAI_GetError(e));
    }
    if (e) RedisAI_FreeError(e);
    if (inner) RedisAI_ModelRunCtxFree(inner);
    model_run_done(fctx, n->st);
}

static int mr_nested_sync(Inputs *in, RAI_Model *model, char *failed) {
    RAI_ModelRunCtx *mctx = NULL;
    Nested n = {.st = async_new(), .model = model, .in = in, .status = REDISMODULE_OK};
    Async *st = n.st;
    CHECK(st, "async state (InitError)");
    mctx = mul_ctx(model, in->a, in->b, failed, __LINE__);
    CHECK(mctx, "run context of m{1}");
    pthread_mutex_lock(&st->lock);
    if (RedisAI_ModelRunAsync(mctx, nested_sync_done, &n) != REDISMODULE_OK) {
        pthread_mutex_unlock(&st->lock);
        CHECK(0, "ModelRunAsync returns REDISMODULE_OK");
    }
    if (!await_callback(&st, failed, __LINE__)) {
        if (!st) mctx = NULL; /* still in use by the run: leaked with the state */
        goto cleanup;
    }
    CHECK(n.status == REDISMODULE_ERR && strstr(n.text, "own threads"),
          "ModelRun inside a completion callback is refused with an error");
    CHECK(has_values(st->outputs[0], in->prod, in->n), "the outer run still gives a * b");
cleanup:
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    async_free(st);
    return !failed[0];
}

/* (e) two contexts of one model in one ModelRun (a batch); different inputs, so that swapped outputs show */
static int mr_batch(Inputs *in, RAI_Model *model, char *failed) {
    RAI_ModelRunCtx *mctxs[2] = {NULL, NULL};
    RAI_Error *err = NULL;
    double squares[MAX_VALUES];
    for (long i = 0; i < in->n; i++) squares[i] = in->va[i] * in->va[i];
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    mctxs[0] = mul_ctx(model, in->a, in->b, failed, __LINE__);
    CHECK(mctxs[0], "first run context");
    mctxs[1] = mul_ctx(model, in->a, in->a, failed, __LINE__);
    CHECK(mctxs[1], "second run context");
    CHECK_ERR(RedisAI_ModelRun(mctxs, 2, err) == REDISMODULE_OK, "ModelRun of 2 contexts", err);
    CHECK(RedisAI_ModelRunCtxNumOutputs(mctxs[0]) == 1 && RedisAI_ModelRunCtxNumOutputs(mctxs[1]) == 1,
          "both contexts of a batch have their output");
    CHECK(has_values(RedisAI_ModelRunCtxOutputTensor(mctxs[0], 0), in->prod, in->n), "batch: first output a * b");
    CHECK(has_values(RedisAI_ModelRunCtxOutputTensor(mctxs[1], 0), squares, in->n), "batch: second output a * a");
    CHECK(shape_is(RedisAI_ModelRunCtxOutputTensor(mctxs[0], 0), in->dims, in->ndims) &&
              shape_is(RedisAI_ModelRunCtxOutputTensor(mctxs[1], 0), in->dims, in->ndims),
          "batch: each output has its own inputs' shape, not the batch's");
cleanup:
    for (int i = 0; i < 2; i++) {
        if (mctxs[i]) RedisAI_ModelRunCtxFree(mctxs[i]);
    }
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

/* (f) GetModelFromKeyspace */
static int mr_keyspace(RedisModuleCtx *ctx, RAI_Model *model, char *failed) {
    RAI_Error *err = NULL;
    RedisModuleString *m = RedisModule_CreateString(ctx, "m{1}", 4);
    RedisModuleString *missing = RedisModule_CreateString(ctx, "nokey{1}", 8);
    RedisModuleString *tensor = RedisModule_CreateString(ctx, "a{1}", 4);
    RAI_Model *found = NULL;
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    CHECK_ERR(RedisAI_GetModelFromKeyspace(ctx, m, &found, REDISMODULE_READ, err) == REDISMODULE_OK,
              "GetModelFromKeyspace of m{1}", err);
    CHECK(found == model, "GetModelFromKeyspace gives the key's value (what ModuleTypeGetValue gives)");
    CHECK(RedisAI_GetModelFromKeyspace(ctx, missing, &found, REDISMODULE_READ, err) == REDISMODULE_ERR,
          "GetModelFromKeyspace of a missing key fails");
    CHECK_ERR(error_is(err, "ERR model key is empty"), "GetModelFromKeyspace: \"ERR model key is empty\"", err);
    RedisAI_ClearError(err);
    CHECK(RedisAI_GetModelFromKeyspace(ctx, tensor, &found, REDISMODULE_READ, err) == REDISMODULE_ERR,
          "GetModelFromKeyspace of a tensor key fails");
    CHECK_ERR(error_is(err, REDISMODULE_ERRORMSG_WRONGTYPE), "GetModelFromKeyspace of a tensor: WRONGTYPE", err);
    CHECK(RedisAI_ModelRedisType() != NULL && RedisAI_ModelRedisType() != RedisAI_TensorRedisType(),
          "ModelRedisType is a type of its own");
cleanup:
    RedisModule_FreeString(ctx, m);
    RedisModule_FreeString(ctx, missing);
    RedisModule_FreeString(ctx, tensor);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

/* (g) a shallow copy runs, and is given back with ModelFree; (h) ModelSerialize */
static int mr_copy_serialize(Inputs *in, RAI_Model *model, char *failed) {
    RAI_Model *copy = NULL;
    RAI_ModelRunCtx *mctx = NULL;
    RAI_Error *err = NULL;
    char *buf = NULL;
    size_t len = 0;
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    copy = RedisAI_ModelGetShallowCopy(model);
    CHECK(copy, "ModelGetShallowCopy");
    mctx = mul_ctx(copy, in->a, in->b, failed, __LINE__);
    CHECK(mctx, "run context of a model's copy");
    CHECK(run_mul_sync(mctx, in->prod, in->n, in->dims, in->ndims, failed, __LINE__), "a model's copy runs");
    RedisAI_ModelRunCtxFree(mctx);
    mctx = NULL;
    RedisAI_ModelFree(copy, err);
    copy = NULL;
    CHECK_ERR(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "ModelFree of a copy sets no error", err);

    CHECK_ERR(RedisAI_ModelSerialize(model, &buf, &len, err) == REDISMODULE_OK, "ModelSerialize of m{1}", err);
    CHECK(buf && len > 0, "ModelSerialize gives a non-empty buffer");
cleanup:
    if (buf) RedisModule_Free(buf); /* allocated with RedisModule_Alloc (redisai.h) */
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    if (copy) RedisAI_ModelFree(copy, NULL);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int cmd_modelrun(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    Inputs in;
    RAI_Model *model = NULL;
    if (!load_inputs(ctx, &in, failed)) goto cleanup;
    model = key_value(ctx, "m{1}", RedisAI_ModelRedisType());
    CHECK(model, "model m{1} in the keyspace, of type ModelRedisType");
    (void)(mr_sync(&in, model, failed) && mr_sync_no_inputs(model, failed) && mr_async(&in, model, failed) &&
           mr_async_no_inputs(model, failed) && mr_nested_sync(&in, model, failed) && mr_batch(&in, model, failed) &&
           mr_keyspace(ctx, model, failed) && mr_copy_serialize(&in, model, failed));
cleanup:
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.FAILTHENRUN SYNC|ASYNC: one run of m{1} that fails (no inputs), then one that succeeds, nothing else, so
 * that AI.INFO's counts after it are exact (RedisAI's test module does this and expects calls 2, errors 1). */

static int cmd_failthenrun(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 2) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    Inputs in;
    RAI_Model *model = NULL;
    RAI_ModelRunCtx *mctx = NULL;
    const char *how = RedisModule_StringPtrLen(argv[1], NULL);
    int sync = strcasecmp(how, "SYNC") == 0;
    CHECK(sync || strcasecmp(how, "ASYNC") == 0, "argument SYNC or ASYNC");
    if (!load_inputs(ctx, &in, failed)) goto cleanup;
    model = key_value(ctx, "m{1}", RedisAI_ModelRedisType());
    CHECK(model, "model m{1} in the keyspace, of type ModelRedisType");
    if (sync) {
        CHECK(mr_sync_no_inputs(model, failed), "sync run without inputs fails");
        mctx = mul_ctx(model, in.a, in.b, failed, __LINE__);
        CHECK(mctx, "run context of m{1}");
        CHECK(run_mul_sync(mctx, in.prod, in.n, in.dims, in.ndims, failed, __LINE__), "sync run of m{1}: a * b");
    } else {
        (void)(mr_async_no_inputs(model, failed) && mr_async(&in, model, failed));
    }
cleanup:
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.MODELCREATE <TF graph> <bad blob> */

static int test_modelcreate(RedisModuleCtx *ctx, RedisModuleString **argv, char *failed) {
    size_t blob_len = 0, bad_len = 0, len = 0;
    const char *blob = RedisModule_StringPtrLen(argv[1], &blob_len);
    const char *bad = RedisModule_StringPtrLen(argv[2], &bad_len);
    char cpu[] = "CPU", tag[] = "tag", nope[] = "NOPE";
    const char *ins[] = {"a", "b"}, *outs[] = {"c"};
    RAI_ModelOpts opts;
    memset(&opts, 0, sizeof opts);
    RAI_Error *err = NULL;
    RAI_Model *model = NULL, *other = NULL;
    RAI_Tensor *ta = NULL, *tb = NULL;
    RAI_ModelRunCtx *mctx = NULL;
    char *buf = NULL;
    long long dims[] = {2, 2};
    const float fa[4] = {1, 2, 3, 4}, fb[4] = {5, 6, 7, 8};
    const double want[4] = {5, 12, 21, 32};
    (void)ctx;

    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    model = RedisAI_ModelCreate(REDISAI_BACKEND_TENSORFLOW, cpu, tag, opts, 2, ins, 1, outs, blob, blob_len, err);
    CHECK_ERR(model, "ModelCreate of tf_mul.pb", err);
    CHECK(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "no error after a successful ModelCreate");

    ta = RedisAI_TensorCreate("FLOAT", dims, 2);
    tb = RedisAI_TensorCreate("FLOAT", dims, 2);
    CHECK(ta && tb && RedisAI_TensorSetData(ta, (const char *)fa, 16) == 1 &&
              RedisAI_TensorSetData(tb, (const char *)fb, 16) == 1,
          "input tensors made with TensorCreate and TensorSetData");
    mctx = mul_ctx(model, ta, tb, failed, __LINE__);
    CHECK(mctx, "run context of the created model");
    /* the context holds its own references to its inputs */
    RedisAI_TensorFree(ta);
    RedisAI_TensorFree(tb);
    ta = tb = NULL;
    CHECK(run_mul_sync(mctx, want, 4, dims, 2, failed, __LINE__),
          "the created model runs: c == a * b, its inputs freed by the caller before the run");

    CHECK_ERR(RedisAI_ModelSerialize(model, &buf, &len, err) == REDISMODULE_OK, "ModelSerialize", err);
    CHECK(buf && len == blob_len && memcmp(buf, blob, len) == 0, "ModelSerialize gives back the graph's bytes");

    other = RedisAI_ModelCreate(REDISAI_BACKEND_TENSORFLOW, cpu, tag, opts, 2, ins, 1, outs, bad, bad_len, err);
    CHECK(other == NULL, "ModelCreate of a bad blob is NULL");
    CHECK(RedisAI_GetErrorCode(err) != RedisAI_ErrorCode_OK && error_nonempty(err),
          "ModelCreate of a bad blob sets an error code and text");
    RedisAI_ClearError(err);
    other = RedisAI_ModelCreate(99, cpu, tag, opts, 2, ins, 1, outs, blob, blob_len, err);
    CHECK(other == NULL, "ModelCreate with backend 99 is NULL");
    CHECK_ERR(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_EUNSUPPORTEDBACKEND,
              "ModelCreate with backend 99: EUNSUPPORTEDBACKEND", err);
    RedisAI_ClearError(err);
    other = RedisAI_ModelCreate(REDISAI_BACKEND_TENSORFLOW, nope, tag, opts, 2, ins, 1, outs, blob, blob_len, err);
    CHECK(other == NULL, "ModelCreate on device \"NOPE\" is NULL");
    CHECK(RedisAI_GetErrorCode(err) != RedisAI_ErrorCode_OK && error_nonempty(err),
          "ModelCreate on device \"NOPE\" sets an error");
    RedisAI_ClearError(err);

    RedisAI_ModelRunCtxFree(mctx);
    mctx = NULL;
    RedisAI_ModelFree(model, err);
    model = NULL;
    CHECK_ERR(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "ModelFree sets no error", err);

cleanup:
    if (buf) RedisModule_Free(buf);
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    if (ta) RedisAI_TensorFree(ta);
    if (tb) RedisAI_TensorFree(tb);
    if (model) RedisAI_ModelFree(model, NULL);
    if (other) RedisAI_ModelFree(other, NULL);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int cmd_modelcreate(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    test_modelcreate(ctx, argv, failed);
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.SCRIPTRUN */

enum { ADD_NEW, ADD_DEPRECATED };

/* Runs fn of `script` synchronously with `inputs` (one by one), then `list` (one input list, if list_len > 0);
 * its single output must hold `want`. `how` picks the adders: ScriptRunCtxAddTensorInput[List], or the deprecated
 * ScriptRunCtxAddInput[List]. */
static int script_sync(RAI_Script *script, const char *fn, RAI_Tensor **inputs, size_t n_inputs, RAI_Tensor **list,
                       size_t list_len, int how, const double *want, long n, char *failed, int line) {
    RAI_ScriptRunCtx *sctx = NULL;
    RAI_Error *err = NULL;
    const char *what = NULL;
    if (RedisAI_InitError(&err) != REDISMODULE_OK || !err) {
        what = "InitError";
        goto done;
    }
    sctx = RedisAI_ScriptRunCtxCreate(script, fn);
    if (!sctx) {
        what = "ScriptRunCtxCreate";
        goto done;
    }
    for (size_t i = 0; i < n_inputs; i++) {
        int r = how == ADD_NEW ? RedisAI_ScriptRunCtxAddTensorInput(sctx, inputs[i])
                               : RedisAI_ScriptRunCtxAddInput(sctx, inputs[i], err);
        if (r != 1) {
            what = how == ADD_NEW ? "ScriptRunCtxAddTensorInput returns 1" : "ScriptRunCtxAddInput returns 1";
            goto done;
        }
    }
    if (list_len > 0) {
        int r = how == ADD_NEW ? RedisAI_ScriptRunCtxAddTensorInputList(sctx, list, list_len)
                               : RedisAI_ScriptRunCtxAddInputList(sctx, list, list_len, err);
        if (r != 1) {
            what = how == ADD_NEW ? "ScriptRunCtxAddTensorInputList returns 1" : "ScriptRunCtxAddInputList returns 1";
            goto done;
        }
    }
    if (RedisAI_ScriptRunCtxAddOutput(sctx) != 1) {
        what = "ScriptRunCtxAddOutput returns 1";
        goto done;
    }
    if (RedisAI_ScriptRun(sctx, err) != REDISMODULE_OK) {
        what = "ScriptRun (sync) returns REDISMODULE_OK";
        goto done;
    }
    if (RedisAI_ScriptRunCtxNumOutputs(sctx) != 1) {
        what = "ScriptRunCtxNumOutputs == 1 after the run";
        goto done;
    }
    if (!has_values(RedisAI_ScriptRunCtxOutputTensor(sctx, 0), want, n)) {
        what = "the script's output holds the expected values";
        goto done;
    }
    if (RedisAI_ScriptRunCtxOutputTensor(sctx, 1) != NULL) {
        what = "ScriptRunCtxOutputTensor past the last output is NULL";
        goto done;
    }
done:
    if (what) record_failure(failed, what, __FILE__, line, err);
    if (sctx) RedisAI_ScriptRunCtxFree(sctx);
    if (err) RedisAI_FreeError(err);
    return what == NULL;
}

static int sr_sync(Inputs *in, RAI_Script *script, char *failed) {
    RAI_Tensor *ab[] = {in->a, in->b}, *bb[] = {in->b, in->b};
    double a2b[MAX_VALUES];
    for (long i = 0; i < in->n; i++) a2b[i] = in->va[i] + 2 * in->vb[i];
    CHECK(script_sync(script, "bar", ab, 2, NULL, 0, ADD_NEW, in->sum, in->n, failed, __LINE__),
          "bar(a, b) == a + b, ScriptRunCtxAddTensorInput");
    CHECK(script_sync(script, "bar", ab, 2, NULL, 0, ADD_DEPRECATED, in->sum, in->n, failed, __LINE__),
          "bar(a, b) == a + b, ScriptRunCtxAddInput");
    CHECK(script_sync(script, "bar_variadic", ab, 1, bb, 2, ADD_NEW, a2b, in->n, failed, __LINE__),
          "bar_variadic(a, [b, b]) == a + 2b, ScriptRunCtxAddTensorInputList");
    CHECK(script_sync(script, "bar_variadic", ab, 1, bb, 2, ADD_DEPRECATED, a2b, in->n, failed, __LINE__),
          "bar_variadic(a, [b, b]) == a + 2b, ScriptRunCtxAddInputList");
cleanup:
    return !failed[0];
}

/* An async run of fn(a, b); the callback's view is left in *stp for the caller to check. */
static int script_async(RAI_Script *script, const char *fn, Inputs *in, int probe, Async **stp, char *failed,
                        int line) {
    RAI_ScriptRunCtx *sctx = NULL;
    Async *st = async_new();
    *stp = st;
    if (!st) {
        record_failure(failed, "async state (InitError)", __FILE__, line, NULL);
        return 0;
    }
    st->probe = probe;
    sctx = RedisAI_ScriptRunCtxCreate(script, fn);
    if (!sctx || RedisAI_ScriptRunCtxAddTensorInput(sctx, in->a) != 1 ||
        RedisAI_ScriptRunCtxAddTensorInput(sctx, in->b) != 1 || RedisAI_ScriptRunCtxAddOutput(sctx) != 1) {
        record_failure(failed, "script run context with inputs a, b and an output", __FILE__, line, NULL);
        if (sctx) RedisAI_ScriptRunCtxFree(sctx);
        return 0;
    }
    pthread_mutex_lock(&st->lock);
    if (RedisAI_ScriptRunAsync(sctx, script_run_done, st) != REDISMODULE_OK) {
        pthread_mutex_unlock(&st->lock);
        record_failure(failed, "ScriptRunAsync returns REDISMODULE_OK", __FILE__, line, NULL);
        RedisAI_ScriptRunCtxFree(sctx);
        return 0;
    }
    if (!await_callback(stp, failed, line)) {
        if (*stp) RedisAI_ScriptRunCtxFree(sctx); /* else still in use by the run: leaked with the state */
        return 0;
    }
    if (st->run_ctx != sctx) {
        record_failure(failed, "GetAsScriptRunCtx returns the context given to ScriptRunAsync", __FILE__, line,
                       NULL);
        RedisAI_ScriptRunCtxFree(sctx);
        return 0;
    }
    RedisAI_ScriptRunCtxFree(sctx);
    st->run_ctx = NULL; /* freed */
    return 1;
}

static int sr_async(Inputs *in, RAI_Script *script, char *failed) {
    Async *st = NULL;
    CHECK(script_async(script, "no_function", in, 0, &st, failed, __LINE__), "async run of no_function");
    CHECK(RedisAI_GetErrorCode(st->err) == RedisAI_ErrorCode_ESCRIPTRUN && error_nonempty(st->err),
          "GetAsScriptRunCtx of a missing function: ESCRIPTRUN with a text");
    async_free(st);
    st = NULL;
    CHECK(script_async(script, "bar", in, 1, &st, failed, __LINE__), "async run of bar");
    CHECK_ERR(RedisAI_GetErrorCode(st->err) == RedisAI_ErrorCode_OK, "GetAsScriptRunCtx: no error", st->err);
    CHECK(st->n_outputs == 1 && !st->null_output && has_values(st->outputs[0], in->sum, in->n),
          "the callback sees 1 output, a + b");
    CHECK(st->past_end_null, "ScriptRunCtxOutputTensor past the last output is NULL (in the callback)");
    CHECK(st->probe_ctx == NULL && st->probe_code == RedisAI_ErrorCode_EFINISHCTX,
          "GetAsModelRunCtx of a script run's finish context: NULL, EFINISHCTX");
cleanup:
    async_free(st);
    return !failed[0];
}

static int sr_keyspace_copy(RedisModuleCtx *ctx, Inputs *in, RAI_Script *script, char *failed) {
    RAI_Error *err = NULL;
    RedisModuleString *s = RedisModule_CreateString(ctx, "myscript{1}", 11);
    RedisModuleString *missing = RedisModule_CreateString(ctx, "nokey{1}", 8);
    RedisModuleString *tensor = RedisModule_CreateString(ctx, "a{1}", 4);
    RAI_Script *found = NULL, *copy = NULL;
    RAI_Tensor *ab[] = {in->a, in->b};
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    CHECK_ERR(RedisAI_GetScriptFromKeyspace(ctx, s, &found, REDISMODULE_READ, err) == REDISMODULE_OK,
              "GetScriptFromKeyspace of myscript{1}", err);
    CHECK(found == script, "GetScriptFromKeyspace gives the key's value");
    CHECK(RedisAI_GetScriptFromKeyspace(ctx, missing, &found, REDISMODULE_READ, err) == REDISMODULE_ERR,
          "GetScriptFromKeyspace of a missing key fails");
    CHECK_ERR(error_is(err, "ERR script key is empty"), "GetScriptFromKeyspace: \"ERR script key is empty\"", err);
    RedisAI_ClearError(err);
    CHECK(RedisAI_GetScriptFromKeyspace(ctx, tensor, &found, REDISMODULE_READ, err) == REDISMODULE_ERR,
          "GetScriptFromKeyspace of a tensor key fails");
    CHECK_ERR(error_is(err, REDISMODULE_ERRORMSG_WRONGTYPE), "GetScriptFromKeyspace of a tensor: WRONGTYPE", err);
    RedisAI_ClearError(err);

    copy = RedisAI_ScriptGetShallowCopy(script);
    CHECK(copy, "ScriptGetShallowCopy");
    CHECK(script_sync(copy, "bar", ab, 2, NULL, 0, ADD_NEW, in->sum, in->n, failed, __LINE__), "a script's copy runs");
    RedisAI_ScriptFree(copy, err);
    copy = NULL;
    CHECK_ERR(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "ScriptFree of a copy sets no error", err);
    CHECK(RedisAI_ScriptRedisType() != NULL && RedisAI_ScriptRedisType() != RedisAI_TensorRedisType() &&
              RedisAI_ScriptRedisType() != RedisAI_ModelRedisType(),
          "ScriptRedisType is a type of its own");
cleanup:
    if (copy) RedisAI_ScriptFree(copy, NULL);
    RedisModule_FreeString(ctx, s);
    RedisModule_FreeString(ctx, missing);
    RedisModule_FreeString(ctx, tensor);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int sr_create(Inputs *in, char *failed) {
    RAI_Error *err = NULL;
    RAI_Script *script = NULL, *bad = NULL;
    RAI_ScriptRunCtx *sctx = NULL;
    char cpu[] = "CPU", tag[] = "tag";
    double twice[MAX_VALUES];
    RAI_Tensor *a[] = {in->a};
    for (long i = 0; i < in->n; i++) twice[i] = 2 * in->va[i];
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    script = RedisAI_ScriptCreate(cpu, tag, "def f(a):\n    return a * 2\n", err);
    CHECK_ERR(script, "ScriptCreate of def f(a): return a * 2", err);
    CHECK(script_sync(script, "f", a, 1, NULL, 0, ADD_NEW, twice, in->n, failed, __LINE__),
          "a script made with ScriptCreate runs: f(a) == 2a");
    RedisAI_ScriptFree(script, err);
    script = NULL;
    CHECK_ERR(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "ScriptFree sets no error", err);
    bad = RedisAI_ScriptCreate(cpu, tag, "def f(a:\n    return a\n", err);
    CHECK(bad == NULL, "ScriptCreate of a syntax error is NULL");
    CHECK(RedisAI_GetErrorCode(err) != RedisAI_ErrorCode_OK && error_nonempty(err),
          "ScriptCreate of a syntax error sets an error");
    /* A run of the API has no client, so no ACL user its callbacks could act as: redis.execute is refused
     * (test_llapi.py checks that the key was not written). */
    RedisAI_ClearError(err);
    script = RedisAI_ScriptCreate(cpu, tag, "def setkey(a):\n    redis.execute(\"SET\", [\"llapi:callback\", \"1\"])\n"
                                            "    return a\n", err);
    CHECK_ERR(script, "ScriptCreate of a script calling redis.execute", err);
    sctx = RedisAI_ScriptRunCtxCreate(script, "setkey");
    CHECK(sctx && RedisAI_ScriptRunCtxAddTensorInput(sctx, in->a) == 1 && RedisAI_ScriptRunCtxAddOutput(sctx) == 1,
          "run context of setkey");
    CHECK(RedisAI_ScriptRun(sctx, err) == REDISMODULE_ERR && strstr(RedisAI_GetError(err), "NOPERM"),
          "redis.execute in a script run through the API is refused (NOPERM)");
cleanup:
    if (sctx) RedisAI_ScriptRunCtxFree(sctx);
    if (script) RedisAI_ScriptFree(script, NULL);
    if (bad) RedisAI_ScriptFree(bad, NULL);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int cmd_scriptrun(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    Inputs in;
    RAI_Script *script = NULL;
    if (!load_inputs(ctx, &in, failed)) goto cleanup;
    script = key_value(ctx, "myscript{1}", RedisAI_ScriptRedisType());
    CHECK(script, "script myscript{1} in the keyspace, of type ScriptRedisType");
    (void)(sr_sync(&in, script, failed) && sr_async(&in, script, failed) &&
           sr_keyspace_copy(ctx, &in, script, failed) && sr_create(&in, failed));
cleanup:
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.DAGRUN: RedisAI's tests/module/DAG_utils.c, and a DAG with neither model nor script */

/* Runs `run` with dag_done and waits for the callback; *stp gets the callback's view. On a timeout *runp is set
 * to NULL: the DAG is leaked with the state, since the run may still use it. */
static int dag_run_wait(RAI_DAGRunCtx **runp, int probe, Async **stp, char *failed, int line) {
    RAI_Error *err = NULL;
    Async *st = async_new();
    *stp = st;
    if (!st || RedisAI_InitError(&err) != REDISMODULE_OK || !err) {
        record_failure(failed, "async state and error (InitError)", __FILE__, line, NULL);
        return 0;
    }
    st->probe = probe;
    pthread_mutex_lock(&st->lock);
    if (RedisAI_DAGRun(*runp, dag_done, st, err) != REDISMODULE_OK) {
        pthread_mutex_unlock(&st->lock);
        record_failure(failed, "DAGRun returns REDISMODULE_OK", __FILE__, line, err);
        RedisAI_FreeError(err);
        return 0;
    }
    RedisAI_FreeError(err);
    if (!await_callback(stp, failed, line)) {
        if (!*stp) *runp = NULL;
        return 0;
    }
    return 1;
}

/* DAGRun must refuse `run` with exactly `text`, without calling back. */
static int dag_refused(RAI_DAGRunCtx *run, const char *text, char *failed, int line) {
    RAI_Error *err = NULL;
    int ok = 0;
    if (RedisAI_InitError(&err) != REDISMODULE_OK || !err) {
        record_failure(failed, "InitError", __FILE__, line, NULL);
        return 0;
    }
    if (RedisAI_DAGRun(run, must_not_run, NULL, err) != REDISMODULE_ERR) {
        record_failure(failed, "DAGRun refuses the DAG (REDISMODULE_ERR)", __FILE__, line, NULL);
    } else if (!error_is(err, text)) {
        record_failure(failed, "DAGRun's error text", __FILE__, line, err);
    } else if (RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK) {
        record_failure(failed, "DAGRun's error code is not OK", __FILE__, line, NULL);
    } else if (!no_unexpected_callbacks()) {
        record_failure(failed, "no callback for a DAG that DAGRun refused", __FILE__, line, NULL);
    } else {
        ok = 1;
    }
    RedisAI_FreeError(err);
    return ok;
}

/* (1) LOAD, twice under one name */
static int dag_load(Inputs *in, char *failed) {
    RAI_DAGRunCtx *run = RedisAI_DAGRunCtxCreate();
    CHECK(run, "DAGRunCtxCreate");
    CHECK(RedisAI_DAGLoadTensor(run, "input", in->a) == REDISMODULE_OK, "DAGLoadTensor");
    CHECK(RedisAI_DAGLoadTensor(run, "input", in->b) == REDISMODULE_ERR, "DAGLoadTensor of a name loaded: ERR");
    CHECK(RedisAI_DAGNumOps(run) == 0, "DAGNumOps: a LOAD is no op");
cleanup:
    if (run) RedisAI_DAGFree(run);
    return !failed[0];
}

/* (2) model ops that do not match their model are refused, and stay the caller's */
static int dag_model_op_refused(RAI_Model *model, char *failed) {
    RAI_DAGRunCtx *run = RedisAI_DAGRunCtxCreate();
    RAI_DAGRunOp *op = NULL;
    RAI_Error *err = NULL;
    CHECK(run, "DAGRunCtxCreate");
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    op = RedisAI_DAGCreateModelRunOp(model);
    CHECK(op, "DAGCreateModelRunOp");
    CHECK(RedisAI_DAGRunOpAddInput(op, "first_input") == REDISMODULE_OK, "DAGRunOpAddInput");
    CHECK(RedisAI_DAGAddRunOp(run, op, err) == REDISMODULE_ERR, "DAGAddRunOp of 1 input for 2: ERR");
    CHECK_ERR(error_is(err, "Number of keys given as INPUTS does not match model definition"),
              "DAGAddRunOp: the INPUTS error", err);
    RedisAI_ClearError(err);
    CHECK(RedisAI_DAGRunOpAddInput(op, "second_input") == REDISMODULE_OK, "DAGRunOpAddInput, second");
    CHECK(RedisAI_DAGAddRunOp(run, op, err) == REDISMODULE_ERR, "DAGAddRunOp of 0 outputs for 1: ERR");
    CHECK_ERR(error_is(err, "Number of keys given as OUTPUTS does not match model definition"),
              "DAGAddRunOp: the OUTPUTS error", err);
    CHECK(RedisAI_DAGNumOps(run) == 0, "a refused op is not in the DAG");
    RedisAI_DAGRunOpFree(op);
    op = NULL;

    /* an op that matches is taken (and then freed by DAGFree); its inputs, never loaded, fail DAGRun */
    op = RedisAI_DAGCreateModelRunOp(model);
    CHECK(op, "DAGCreateModelRunOp, second op");
    CHECK(RedisAI_DAGRunOpAddInput(op, "first_input") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddInput(op, "second_input") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddOutput(op, "output") == REDISMODULE_OK,
          "DAGRunOpAddInput x2, DAGRunOpAddOutput");
    RedisAI_ClearError(err);
    int added = RedisAI_DAGAddRunOp(run, op, err);
    if (added == REDISMODULE_OK) op = NULL; /* the DAG's now */
    CHECK_ERR(added == REDISMODULE_OK, "DAGAddRunOp of a matching op", err);
    CHECK(RedisAI_DAGNumOps(run) == 1, "DAGNumOps == 1");
    CHECK(dag_refused(run, "ERR INPUT key cannot be found in DAG", failed, __LINE__),
          "DAGRun of a model op whose inputs are not in the DAG");
cleanup:
    if (op) RedisAI_DAGRunOpFree(op);
    if (run) RedisAI_DAGFree(run);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

/* (3) only a LOAD: empty; (4) a TENSORGET of a name that is nowhere */
static int dag_refusals(Inputs *in, char *failed) {
    RAI_DAGRunCtx *run = RedisAI_DAGRunCtxCreate();
    CHECK(run && RedisAI_DAGLoadTensor(run, "input", in->a) == REDISMODULE_OK, "a DAG with a LOAD");
    CHECK(dag_refused(run, "ERR DAG is empty", failed, __LINE__), "DAGRun of a DAG with only a LOAD");
    RedisAI_DAGFree(run);
    run = RedisAI_DAGRunCtxCreate();
    CHECK(run && RedisAI_DAGLoadTensor(run, "input", in->a) == REDISMODULE_OK, "a second DAG with a LOAD");
    CHECK(RedisAI_DAGAddTensorGet(run, "non existing tensor") == REDISMODULE_OK, "DAGAddTensorGet");
    CHECK(dag_refused(run, "ERR INPUT key cannot be found in DAG", failed, __LINE__),
          "DAGRun of a TENSORGET of a name not in the DAG");
cleanup:
    if (run) RedisAI_DAGFree(run);
    return !failed[0];
}

/* (5) LOAD a, b; m{1}; TENSORGET */
static int dag_model(Inputs *in, RAI_Model *model, char *failed) {
    RAI_DAGRunCtx *run = RedisAI_DAGRunCtxCreate();
    RAI_DAGRunOp *op = NULL;
    RAI_Error *err = NULL;
    Async *st = NULL;
    CHECK(run, "DAGRunCtxCreate");
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    CHECK(RedisAI_DAGLoadTensor(run, "input1", in->a) == REDISMODULE_OK &&
              RedisAI_DAGLoadTensor(run, "input2", in->b) == REDISMODULE_OK,
          "DAGLoadTensor input1, input2");
    op = RedisAI_DAGCreateModelRunOp(model);
    CHECK(op, "DAGCreateModelRunOp");
    CHECK(RedisAI_DAGRunOpAddInput(op, "input1") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddInput(op, "input2") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddOutput(op, "output") == REDISMODULE_OK,
          "the op's inputs and output");
    int added = RedisAI_DAGAddRunOp(run, op, err);
    if (added == REDISMODULE_OK) op = NULL;
    CHECK_ERR(added == REDISMODULE_OK, "DAGAddRunOp", err);
    CHECK(RedisAI_DAGAddTensorGet(run, "output") == REDISMODULE_OK, "DAGAddTensorGet output");
    CHECK(RedisAI_DAGNumOps(run) == 2, "DAGNumOps == 2 (the model op and the TENSORGET)");
    if (!dag_run_wait(&run, 0, &st, failed, __LINE__)) goto cleanup;
    CHECK(st->run_error == 0, "DAGRunError == 0");
    CHECK(st->n_outputs == 1 && !st->null_output, "DAGNumOutputs == 1, DAGOutputTensor(0) not NULL");
    CHECK(st->past_end_null, "DAGOutputTensor(1) is NULL");
    CHECK(has_values(st->outputs[0], in->prod, in->n), "the DAG's output is a * b");
cleanup:
    if (op) RedisAI_DAGRunOpFree(op);
    if (run) RedisAI_DAGFree(run);
    if (err) RedisAI_FreeError(err);
    async_free(st);
    return !failed[0];
}

/* (6), (7) TENSORSET a, b; a script op of myscript{1}; TENSORGET */
static int dag_script(Inputs *in, RAI_Script *script, const char *fn, char *failed) {
    RAI_DAGRunCtx *run = RedisAI_DAGRunCtxCreate();
    RAI_DAGRunOp *op = NULL;
    RAI_Error *err = NULL;
    Async *st = NULL;
    int good = strcmp(fn, "bar") == 0;
    CHECK(run, "DAGRunCtxCreate");
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    CHECK(RedisAI_DAGAddTensorSet(run, "input1", in->a) == REDISMODULE_OK &&
              RedisAI_DAGAddTensorSet(run, "input2", in->b) == REDISMODULE_OK,
          "DAGAddTensorSet input1, input2");
    op = RedisAI_DAGCreateScriptRunOp(script, fn);
    CHECK(op, "DAGCreateScriptRunOp");
    CHECK(RedisAI_DAGRunOpAddInput(op, "input1") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddInput(op, "input2") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddOutput(op, "output") == REDISMODULE_OK,
          "the op's inputs and output");
    int added = RedisAI_DAGAddRunOp(run, op, err);
    if (added == REDISMODULE_OK) op = NULL;
    CHECK_ERR(added == REDISMODULE_OK, "DAGAddRunOp of a script op", err);
    CHECK(RedisAI_DAGAddTensorGet(run, "output") == REDISMODULE_OK, "DAGAddTensorGet output");
    CHECK(RedisAI_DAGNumOps(run) == 4, "DAGNumOps == 4 (2 TENSORSETs, the script op, the TENSORGET)");
    if (!dag_run_wait(&run, 0, &st, failed, __LINE__)) goto cleanup;
    if (good) {
        CHECK_ERR(st->run_error == 0, "DAGRunError == 0", st->err);
        CHECK(st->n_outputs == 1 && !st->null_output && has_values(st->outputs[0], in->sum, in->n),
              "the DAG's output is a + b");
    } else {
        CHECK(st->run_error == 1, "DAGRunError == 1 for a missing function");
        CHECK(!st->dag_error_null, "DAGGetError is not NULL when DAGRunError is set");
        CHECK_ERR(RedisAI_GetErrorCode(st->err) == RedisAI_ErrorCode_ESCRIPTRUN && error_nonempty(st->err),
                  "DAGGetError (cloned): ESCRIPTRUN with a text", st->err);
        CHECK(st->outputs[0] == NULL, "no outputs collected from a failed DAG");
    }
cleanup:
    if (op) RedisAI_DAGRunOpFree(op);
    if (run) RedisAI_DAGFree(run);
    if (err) RedisAI_FreeError(err);
    async_free(st);
    return !failed[0];
}

/* (8) ops from strings */
static int dag_from_string(Inputs *in, char *failed) {
    RAI_DAGRunCtx *run = RedisAI_DAGRunCtxCreate();
    RAI_Error *err = NULL;
    Async *st = NULL;
    CHECK(run, "DAGRunCtxCreate");
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    CHECK(RedisAI_DAGLoadTensor(run, "input1", in->a) == REDISMODULE_OK, "DAGLoadTensor input1");
    CHECK(RedisAI_DAGAddOpsFromString(run, "bad string", err) == REDISMODULE_ERR,
          "DAGAddOpsFromString(\"bad string\"): ERR");
    CHECK_ERR(error_is(err, "DAG op should start with: '|>' "), "DAGAddOpsFromString: the '|>' error", err);
    RedisAI_ClearError(err);
    CHECK(RedisAI_DAGAddTensorSet(run, "input2", in->b) == REDISMODULE_OK, "DAGAddTensorSet input2");
    CHECK(RedisAI_DAGAddOpsFromString(
              run, "|> AI.MODELEXECUTE m{1} INPUTS 2 input1 input2 OUTPUTS 1 output |> bad_op no_tensor", err) ==
              REDISMODULE_ERR,
          "DAGAddOpsFromString with an unknown op: ERR");
    CHECK_ERR(error_is(err, "Unsupported command within DAG"), "DAGAddOpsFromString: the unknown op error", err);
    RedisAI_ClearError(err);
    CHECK(RedisAI_DAGNumOps(run) == 1, "a refused string adds no op (DAGNumOps == 1, the TENSORSET)");
    CHECK_ERR(RedisAI_DAGAddOpsFromString(
                  run, "|> AI.MODELEXECUTE m{1} INPUTS 2 input1 input2 OUTPUTS 1 output |> AI.TENSORGET output",
                  err) == REDISMODULE_OK,
              "DAGAddOpsFromString of a MODELEXECUTE and a TENSORGET", err);
    CHECK(RedisAI_DAGNumOps(run) == 3, "DAGNumOps == 3");
    CHECK(RedisAI_DAGAddTensorGet(run, "input1") == REDISMODULE_OK, "DAGAddTensorGet input1");
    CHECK(RedisAI_DAGNumOps(run) == 4, "DAGNumOps == 4");
    if (!dag_run_wait(&run, 0, &st, failed, __LINE__)) goto cleanup;
    CHECK_ERR(st->run_error == 0, "DAGRunError == 0", st->err);
    CHECK(st->n_outputs == 2 && !st->null_output, "DAGNumOutputs == 2");
    CHECK(has_values(st->outputs[0], in->prod, in->n), "output 0 is a * b");
    CHECK(has_values(st->outputs[1], in->va, in->n), "output 1 is input1 (a)");
cleanup:
    if (run) RedisAI_DAGFree(run);
    if (err) RedisAI_FreeError(err);
    async_free(st);
    return !failed[0];
}

/* (9) neither model nor script: the callback still comes, from another thread */
static int dag_tensors_only(Inputs *in, char *failed) {
    RAI_DAGRunCtx *run = RedisAI_DAGRunCtxCreate();
    Async *st = NULL;
    CHECK(run, "DAGRunCtxCreate");
    CHECK(RedisAI_DAGAddTensorSet(run, "x", in->a) == REDISMODULE_OK &&
              RedisAI_DAGAddTensorGet(run, "x") == REDISMODULE_OK,
          "DAGAddTensorSet x, DAGAddTensorGet x");
    if (!dag_run_wait(&run, 1, &st, failed, __LINE__)) goto cleanup;
    CHECK(st->run_error == 0, "DAGRunError == 0");
    CHECK(st->n_outputs == 1 && !st->null_output && has_values(st->outputs[0], in->va, in->n),
          "the DAG's one output is a");
    CHECK(st->probe_ctx == NULL && st->probe_code == RedisAI_ErrorCode_EFINISHCTX,
          "GetAsModelRunCtx of a DAG's finish context: NULL, EFINISHCTX");
cleanup:
    if (run) RedisAI_DAGFree(run);
    async_free(st);
    return !failed[0];
}

static int cmd_dagrun(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    Inputs in;
    RAI_Model *model = NULL;
    RAI_Script *script = NULL;
    if (!load_inputs(ctx, &in, failed)) goto cleanup;
    model = key_value(ctx, "m{1}", RedisAI_ModelRedisType());
    script = key_value(ctx, "myscript{1}", RedisAI_ScriptRedisType());
    CHECK(model && script, "m{1} and myscript{1} in the keyspace");
    (void)(dag_load(&in, failed) && dag_model_op_refused(model, failed) && dag_refusals(&in, failed) &&
           dag_model(&in, model, failed) && dag_script(&in, script, "bar", failed) &&
           dag_script(&in, script, "no_function", failed) && dag_from_string(&in, failed) &&
           dag_tensors_only(&in, failed));
    CHECK(no_unexpected_callbacks(), "no callback ever came for a DAG that DAGRun refused");
cleanup:
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.DAG_MULTIDEVICE: m{1} on CPU, then m2{1} on CPU:1 on its output */

static int test_dag_multidevice(RedisModuleCtx *ctx, char *failed) {
    Inputs in;
    RAI_DAGRunCtx *run = NULL;
    RAI_DAGRunOp *op = NULL;
    RAI_Error *err = NULL;
    Async *st = NULL;
    double abb[MAX_VALUES];
    if (!load_inputs(ctx, &in, failed)) goto cleanup;
    RAI_Model *m1 = key_value(ctx, "m{1}", RedisAI_ModelRedisType());
    RAI_Model *m2 = key_value(ctx, "m2{1}", RedisAI_ModelRedisType());
    CHECK(m1 && m2, "m{1} and m2{1} in the keyspace");
    for (long i = 0; i < in.n; i++) abb[i] = in.prod[i] * in.vb[i];
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    run = RedisAI_DAGRunCtxCreate();
    CHECK(run, "DAGRunCtxCreate");
    CHECK(RedisAI_DAGLoadTensor(run, "input1", in.a) == REDISMODULE_OK &&
              RedisAI_DAGLoadTensor(run, "input2", in.b) == REDISMODULE_OK,
          "DAGLoadTensor input1, input2");

    op = RedisAI_DAGCreateModelRunOp(m1);
    CHECK(op && RedisAI_DAGRunOpAddInput(op, "input1") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddInput(op, "input2") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddOutput(op, "ab") == REDISMODULE_OK,
          "the op of m{1}");
    int added = RedisAI_DAGAddRunOp(run, op, err);
    if (added == REDISMODULE_OK) op = NULL;
    CHECK_ERR(added == REDISMODULE_OK, "DAGAddRunOp of m{1}", err);

    op = RedisAI_DAGCreateModelRunOp(m2);
    CHECK(op && RedisAI_DAGRunOpAddInput(op, "ab") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddInput(op, "input2") == REDISMODULE_OK &&
              RedisAI_DAGRunOpAddOutput(op, "abb") == REDISMODULE_OK,
          "the op of m2{1}, on m{1}'s output");
    added = RedisAI_DAGAddRunOp(run, op, err);
    if (added == REDISMODULE_OK) op = NULL;
    CHECK_ERR(added == REDISMODULE_OK, "DAGAddRunOp of m2{1}", err);

    CHECK(RedisAI_DAGAddTensorGet(run, "ab") == REDISMODULE_OK && RedisAI_DAGAddTensorGet(run, "abb") == REDISMODULE_OK,
          "DAGAddTensorGet ab, abb");
    CHECK(RedisAI_DAGNumOps(run) == 4, "DAGNumOps == 4");
    if (!dag_run_wait(&run, 0, &st, failed, __LINE__)) goto cleanup;
    CHECK_ERR(st->run_error == 0, "DAGRunError == 0", st->err);
    CHECK(st->n_outputs == 2 && !st->null_output, "DAGNumOutputs == 2");
    CHECK(has_values(st->outputs[0], in.prod, in.n), "output ab (CPU) is a * b");
    CHECK(has_values(st->outputs[1], abb, in.n), "output abb (CPU:1) is a * b * b");
cleanup:
    if (op) RedisAI_DAGRunOpFree(op);
    if (run) RedisAI_DAGFree(run);
    if (err) RedisAI_FreeError(err);
    async_free(st);
    return !failed[0];
}

static int cmd_dag_multidevice(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    test_dag_multidevice(ctx, failed);
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.REFCOUNT: copies outlive their keys; run contexts keep what they were given */

/* Deletes `name` (which must hold a value of `type`) and returns a shallow copy of its value, taken first. */
static void *copy_then_delete(RedisModuleCtx *ctx, const char *name, RedisModuleType *type, int is_model) {
    RedisModuleString *s = RedisModule_CreateString(ctx, name, strlen(name));
    RedisModuleKey *key = RedisModule_OpenKey(ctx, s, REDISMODULE_READ | REDISMODULE_WRITE);
    void *copy = NULL;
    if (key && RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_MODULE && RedisModule_ModuleTypeGetType(key) == type) {
        void *value = RedisModule_ModuleTypeGetValue(key);
        copy = is_model ? (void *)RedisAI_ModelGetShallowCopy(value) : (void *)RedisAI_TensorGetShallowCopy(value);
        if (copy && RedisModule_DeleteKey(key) != REDISMODULE_OK) {
            if (is_model) {
                RedisAI_ModelFree(copy, NULL);
            } else {
                RedisAI_TensorFree(copy);
            }
            copy = NULL;
        }
    }
    if (key) RedisModule_CloseKey(key);
    RedisModule_FreeString(ctx, s);
    return copy;
}

static int test_refcount(RedisModuleCtx *ctx, char *failed) {
    RAI_Tensor *t = NULL;
    RAI_Model *m = NULL;
    RAI_ModelRunCtx *mctx = NULL;
    RAI_Error *err = NULL;
    double vals[MAX_VALUES], squares[MAX_VALUES];
    long long dims[MAX_DIMS];
    int ndims;
    long n;

    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    RAI_Tensor *in_key = key_value(ctx, "tmp{1}", RedisAI_TensorRedisType());
    CHECK(in_key, "tensor tmp{1} in the keyspace");
    n = read_values(in_key, vals);
    ndims = shape_of(in_key, dims);
    CHECK(n > 0 && ndims >= 1, "tmp{1}'s values and shape");
    for (long i = 0; i < n; i++) squares[i] = vals[i] * vals[i];

    t = copy_then_delete(ctx, "tmp{1}", RedisAI_TensorRedisType(), 0);
    CHECK(t, "TensorGetShallowCopy of tmp{1}, then RedisModule_DeleteKey");
    CHECK(!key_exists(ctx, "tmp{1}"), "tmp{1} is deleted");
    CHECK(has_values(t, vals, n) && shape_is(t, dims, ndims), "a tensor's copy reads after its key is deleted");

    m = copy_then_delete(ctx, "mtmp{1}", RedisAI_ModelRedisType(), 1);
    CHECK(m, "ModelGetShallowCopy of mtmp{1}, then RedisModule_DeleteKey");
    CHECK(!key_exists(ctx, "mtmp{1}"), "mtmp{1} is deleted");
    mctx = mul_ctx(m, t, t, failed, __LINE__);
    CHECK(mctx, "run context of the model's copy");
    CHECK(run_mul_sync(mctx, squares, n, dims, ndims, failed, __LINE__),
          "a model's copy runs after its key is deleted");
    RedisAI_ModelRunCtxFree(mctx);
    mctx = NULL;

    /* A second context, then our model and tensor references given back before it runs: the context's own
     * references are the last ones, and the run must still work (and, under valgrind, touch no freed memory). */
    mctx = mul_ctx(m, t, t, failed, __LINE__);
    CHECK(mctx, "second run context");
    RedisAI_ModelFree(m, err);
    m = NULL;
    CHECK_ERR(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "ModelFree of the copy sets no error", err);
    RedisAI_TensorFree(t);
    t = NULL;
    CHECK(run_mul_sync(mctx, squares, n, dims, ndims, failed, __LINE__),
          "a context runs after the caller freed its model and its input");
cleanup:
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    if (m) RedisAI_ModelFree(m, NULL);
    if (t) RedisAI_TensorFree(t);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int cmd_refcount(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    test_refcount(ctx, failed);
    return reply_result(ctx, failed);
}

/* ============================================================================================================
 * LLAPI.NULLS: NULL where a pointer is expected. Where redisai.h documents a failure value it is checked; the
 * rest must only not crash. */

static int nulls_errors_tensors(RAI_Tensor *a, char *failed) {
    RAI_Error *err = NULL;
    long long dims[] = {2, 2};
    long long ll = 0;
    const char data[16] = {0};
    RAI_Tensor *with_null[] = {a, NULL};

    CHECK(RedisAI_InitError(NULL) == REDISMODULE_ERR, "InitError(NULL) returns REDISMODULE_ERR");
    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    RedisAI_ClearError(NULL);
    RedisAI_FreeError(NULL);
    (void)RedisAI_GetError(NULL);
    (void)RedisAI_GetErrorOneLine(NULL);
    (void)RedisAI_GetErrorCode(NULL);
    RedisAI_CloneError(NULL, err);
    RedisAI_CloneError(err, NULL);
    CHECK(RedisAI_GetErrorCode(err) == RedisAI_ErrorCode_OK, "CloneError(err, NULL) leaves err as it was");

    CHECK(RedisAI_TensorCreate(NULL, dims, 2) == NULL, "TensorCreate(NULL type) is NULL");
    CHECK(RedisAI_TensorCreate("FLOAT", NULL, 2) == NULL, "TensorCreate(NULL dims) is NULL");
    CHECK(RedisAI_TensorCreate("FLOAT", dims, -1) == NULL, "TensorCreate with ndims -1 is NULL");
    CHECK(RedisAI_TensorCreateByConcatenatingTensors(NULL, 2) == NULL, "TensorCreateByConcatenatingTensors(NULL)");
    CHECK(RedisAI_TensorCreateByConcatenatingTensors(with_null, 2) == NULL,
          "TensorCreateByConcatenatingTensors of {a, NULL} is NULL");
    CHECK(RedisAI_TensorCreateByConcatenatingTensors(with_null, 0) == NULL,
          "TensorCreateByConcatenatingTensors of 0 tensors is NULL");
    CHECK(RedisAI_TensorCreateBySlicingTensor(NULL, 0, 1) == NULL, "TensorCreateBySlicingTensor(NULL) is NULL");
    CHECK(RedisAI_TensorDataSize(NULL) == 0, "TensorDataSize(NULL) == 0");
    (void)RedisAI_TensorDataType(NULL);
    CHECK(RedisAI_TensorByteSize(NULL) == 0, "TensorByteSize(NULL) == 0");
    (void)RedisAI_TensorNumDims(NULL);
    CHECK(RedisAI_TensorDim(NULL, 0) == -1, "TensorDim(NULL, 0) == -1");
    CHECK(RedisAI_TensorSetData(NULL, data, 16) == 0, "TensorSetData(NULL tensor) returns 0");
    CHECK(RedisAI_TensorSetValueFromLongLong(NULL, 0, 1) == 0, "TensorSetValueFromLongLong(NULL) returns 0");
    CHECK(RedisAI_TensorSetValueFromDouble(NULL, 0, 1) == 0, "TensorSetValueFromDouble(NULL) returns 0");
    CHECK(RedisAI_TensorGetValueAsLongLong(NULL, 0, &ll) == 0, "TensorGetValueAsLongLong(NULL) returns 0");
    CHECK(RedisAI_TensorGetValueAsDouble(a, 0, NULL) == 0, "TensorGetValueAsDouble(t, 0, NULL) returns 0");
    CHECK(RedisAI_TensorGetValueAsLongLong(a, 0, NULL) == 0, "TensorGetValueAsLongLong(t, 0, NULL) returns 0");
cleanup:
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int nulls_models(RedisModuleCtx *ctx, RAI_Model *model, RAI_Tensor *a, char *failed) {
    RAI_Error *err = NULL;
    RAI_ModelRunCtx *mctx = NULL;
    RAI_ModelRunCtx *none[] = {NULL};
    RAI_Model *found = NULL;
    RedisModuleString *name = RedisModule_CreateString(ctx, "m{1}", 4);
    char *buf = NULL;
    size_t len = 0;
    char cpu[] = "CPU", tag[] = "";
    const char *ins[] = {"a", "b"}, *outs[] = {"c"};
    RAI_ModelOpts opts;
    memset(&opts, 0, sizeof opts);

    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    CHECK(RedisAI_ModelCreate(REDISAI_BACKEND_TENSORFLOW, NULL, tag, opts, 2, ins, 1, outs, "x", 1, err) == NULL,
          "ModelCreate(NULL device) is NULL");
    CHECK(RedisAI_ModelCreate(REDISAI_BACKEND_TENSORFLOW, cpu, tag, opts, 2, ins, 1, outs, NULL, 10, err) == NULL,
          "ModelCreate(NULL blob) is NULL");
    CHECK(RedisAI_ModelCreate(REDISAI_BACKEND_TENSORFLOW, cpu, tag, opts, 2, ins, 1, outs, "not a graph", 11,
                              NULL) == NULL,
          "ModelCreate of a bad blob with a NULL error is NULL");
    RedisAI_ModelFree(NULL, err);
    RedisAI_ModelFree(NULL, NULL);
    CHECK(RedisAI_ModelRunCtxCreate(NULL) == NULL, "ModelRunCtxCreate(NULL) is NULL");
    CHECK(RedisAI_GetModelFromKeyspace(ctx, NULL, &found, REDISMODULE_READ, err) == REDISMODULE_ERR,
          "GetModelFromKeyspace(NULL key name) fails");
    CHECK(RedisAI_GetModelFromKeyspace(ctx, name, NULL, REDISMODULE_READ, err) == REDISMODULE_ERR,
          "GetModelFromKeyspace(NULL out) fails");
    CHECK(RedisAI_ModelRunCtxAddInput(NULL, "a", a) == 0, "ModelRunCtxAddInput(NULL ctx) returns 0");
    CHECK(RedisAI_ModelRunCtxAddOutput(NULL, "c") == 0, "ModelRunCtxAddOutput(NULL ctx) returns 0");
    CHECK(RedisAI_ModelRunCtxNumOutputs(NULL) == 0, "ModelRunCtxNumOutputs(NULL) == 0");
    CHECK(RedisAI_ModelRunCtxOutputTensor(NULL, 0) == NULL, "ModelRunCtxOutputTensor(NULL) is NULL");
    RedisAI_ModelRunCtxFree(NULL);
    CHECK(RedisAI_ModelRun(NULL, 1, err) == REDISMODULE_ERR, "ModelRun(NULL) returns REDISMODULE_ERR");
    CHECK(RedisAI_ModelRun(none, 1, err) == REDISMODULE_ERR, "ModelRun({NULL}, 1) returns REDISMODULE_ERR");
    CHECK(RedisAI_ModelGetShallowCopy(NULL) == NULL, "ModelGetShallowCopy(NULL) is NULL");
    CHECK(RedisAI_ModelSerialize(NULL, &buf, &len, err) == REDISMODULE_ERR, "ModelSerialize(NULL model) fails");
    CHECK(RedisAI_ModelSerialize(model, NULL, &len, err) == REDISMODULE_ERR, "ModelSerialize(NULL buffer) fails");
    CHECK(RedisAI_ModelRunAsync(NULL, must_not_run, NULL) == REDISMODULE_ERR, "ModelRunAsync(NULL) fails");
    CHECK(RedisAI_GetAsModelRunCtx(NULL, err) == NULL, "GetAsModelRunCtx(NULL) is NULL");

    mctx = RedisAI_ModelRunCtxCreate(model);
    CHECK(mctx, "ModelRunCtxCreate");
    CHECK(RedisAI_ModelRunCtxAddInput(mctx, "a", NULL) == 0, "ModelRunCtxAddInput(NULL tensor) returns 0");
    RedisAI_ClearError(err);
    CHECK(RedisAI_ModelRun(&mctx, 0, err) == REDISMODULE_ERR, "ModelRun of 0 contexts fails");
    CHECK(RedisAI_ModelRun(&mctx, 1, NULL) == REDISMODULE_ERR, "a failing ModelRun with a NULL error");
    int rc = RedisAI_ModelRunAsync(mctx, NULL, NULL);
    if (rc != REDISMODULE_ERR) mctx = NULL; /* taken: the run may still use it, so it is leaked */
    CHECK(rc == REDISMODULE_ERR, "ModelRunAsync without a callback fails");
cleanup:
    if (buf) RedisModule_Free(buf);
    if (mctx) RedisAI_ModelRunCtxFree(mctx);
    RedisModule_FreeString(ctx, name);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int nulls_scripts(RedisModuleCtx *ctx, RAI_Script *script, RAI_Tensor *a, char *failed) {
    RAI_Error *err = NULL;
    RAI_ScriptRunCtx *sctx = NULL;
    RAI_Script *found = NULL;
    RAI_Tensor *list[] = {a, a};
    char cpu[] = "CPU", tag[] = "";

    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    CHECK(RedisAI_ScriptCreate(NULL, tag, "def f(a):\n    return a\n", err) == NULL, "ScriptCreate(NULL device)");
    CHECK(RedisAI_ScriptCreate(cpu, tag, NULL, err) == NULL, "ScriptCreate(NULL source) is NULL");
    CHECK(RedisAI_GetScriptFromKeyspace(ctx, NULL, &found, REDISMODULE_READ, err) == REDISMODULE_ERR,
          "GetScriptFromKeyspace(NULL key name) fails");
    RedisAI_ScriptFree(NULL, err);
    CHECK(RedisAI_ScriptRunCtxCreate(NULL, "f") == NULL, "ScriptRunCtxCreate(NULL script) is NULL");
    CHECK(RedisAI_ScriptRunCtxCreate(script, NULL) == NULL, "ScriptRunCtxCreate(NULL function) is NULL");
    CHECK(RedisAI_ScriptRunCtxAddInput(NULL, a, err) == 0, "ScriptRunCtxAddInput(NULL ctx) returns 0");
    CHECK(RedisAI_ScriptRunCtxAddInputList(NULL, list, 2, err) == 0, "ScriptRunCtxAddInputList(NULL ctx)");
    CHECK(RedisAI_ScriptRunCtxAddTensorInput(NULL, a) == 0, "ScriptRunCtxAddTensorInput(NULL ctx) returns 0");
    CHECK(RedisAI_ScriptRunCtxAddTensorInputList(NULL, list, 2) == 0, "ScriptRunCtxAddTensorInputList(NULL ctx)");
    CHECK(RedisAI_ScriptRunCtxAddOutput(NULL) == 0, "ScriptRunCtxAddOutput(NULL) returns 0");
    CHECK(RedisAI_ScriptRunCtxNumOutputs(NULL) == 0, "ScriptRunCtxNumOutputs(NULL) == 0");
    CHECK(RedisAI_ScriptRunCtxOutputTensor(NULL, 0) == NULL, "ScriptRunCtxOutputTensor(NULL) is NULL");
    RedisAI_ScriptRunCtxFree(NULL);
    CHECK(RedisAI_ScriptRun(NULL, err) == REDISMODULE_ERR, "ScriptRun(NULL) returns REDISMODULE_ERR");
    CHECK(RedisAI_ScriptGetShallowCopy(NULL) == NULL, "ScriptGetShallowCopy(NULL) is NULL");
    CHECK(RedisAI_ScriptRunAsync(NULL, must_not_run, NULL) == REDISMODULE_ERR, "ScriptRunAsync(NULL) fails");
    CHECK(RedisAI_GetAsScriptRunCtx(NULL, err) == NULL, "GetAsScriptRunCtx(NULL) is NULL");

    sctx = RedisAI_ScriptRunCtxCreate(script, "bar");
    CHECK(sctx, "ScriptRunCtxCreate");
    CHECK(RedisAI_ScriptRunCtxAddTensorInput(sctx, NULL) == 0, "ScriptRunCtxAddTensorInput(NULL tensor) returns 0");
    CHECK(RedisAI_ScriptRunCtxAddInput(sctx, NULL, err) == 0, "ScriptRunCtxAddInput(NULL tensor) returns 0");
    CHECK(RedisAI_ScriptRunCtxAddTensorInputList(sctx, NULL, 2) == 0, "ScriptRunCtxAddTensorInputList(NULL list)");
    CHECK(RedisAI_ScriptRunCtxAddInputList(sctx, NULL, 2, err) == 0, "ScriptRunCtxAddInputList(NULL list)");
    int rc = RedisAI_ScriptRunAsync(sctx, NULL, NULL);
    if (rc != REDISMODULE_ERR) sctx = NULL; /* taken: the run may still use it, so it is leaked */
    CHECK(rc == REDISMODULE_ERR, "ScriptRunAsync without a callback fails");
cleanup:
    if (sctx) RedisAI_ScriptRunCtxFree(sctx);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int nulls_dags(RAI_Model *model, RAI_Script *script, RAI_Tensor *a, char *failed) {
    RAI_Error *err = NULL;
    RAI_DAGRunCtx *run = NULL;
    RAI_DAGRunOp *op = NULL;

    CHECK(RedisAI_InitError(&err) == REDISMODULE_OK && err, "InitError");
    CHECK(RedisAI_DAGCreateModelRunOp(NULL) == NULL, "DAGCreateModelRunOp(NULL) is NULL");
    CHECK(RedisAI_DAGCreateScriptRunOp(NULL, "bar") == NULL, "DAGCreateScriptRunOp(NULL script) is NULL");
    CHECK(RedisAI_DAGCreateScriptRunOp(script, NULL) == NULL, "DAGCreateScriptRunOp(NULL function) is NULL");
    CHECK(RedisAI_DAGRunOpAddInput(NULL, "x") == REDISMODULE_ERR, "DAGRunOpAddInput(NULL op) fails");
    CHECK(RedisAI_DAGRunOpAddOutput(NULL, "x") == REDISMODULE_ERR, "DAGRunOpAddOutput(NULL op) fails");
    CHECK(RedisAI_DAGLoadTensor(NULL, "x", a) == REDISMODULE_ERR, "DAGLoadTensor(NULL DAG) fails");
    CHECK(RedisAI_DAGAddTensorSet(NULL, "x", a) == REDISMODULE_ERR, "DAGAddTensorSet(NULL DAG) fails");
    CHECK(RedisAI_DAGAddTensorGet(NULL, "x") == REDISMODULE_ERR, "DAGAddTensorGet(NULL DAG) fails");
    CHECK(RedisAI_DAGAddOpsFromString(NULL, "|> AI.TENSORGET x", err) == REDISMODULE_ERR,
          "DAGAddOpsFromString(NULL DAG) fails");
    CHECK(RedisAI_DAGNumOps(NULL) == 0, "DAGNumOps(NULL) == 0");
    CHECK(RedisAI_DAGRun(NULL, must_not_run, NULL, err) == REDISMODULE_ERR, "DAGRun(NULL) fails");
    CHECK(RedisAI_DAGNumOutputs(NULL) == 0, "DAGNumOutputs(NULL) == 0");
    CHECK(RedisAI_DAGOutputTensor(NULL, 0) == NULL, "DAGOutputTensor(NULL) is NULL");
    (void)RedisAI_DAGRunError(NULL);
    (void)RedisAI_DAGGetError(NULL);
    RedisAI_DAGRunOpFree(NULL);
    RedisAI_DAGFree(NULL);

    run = RedisAI_DAGRunCtxCreate();
    op = RedisAI_DAGCreateModelRunOp(model);
    CHECK(run && op, "DAGRunCtxCreate, DAGCreateModelRunOp");
    CHECK(RedisAI_DAGRunOpAddInput(op, NULL) == REDISMODULE_ERR, "DAGRunOpAddInput(NULL name) fails");
    CHECK(RedisAI_DAGRunOpAddOutput(op, NULL) == REDISMODULE_ERR, "DAGRunOpAddOutput(NULL name) fails");
    CHECK(RedisAI_DAGAddRunOp(run, NULL, err) == REDISMODULE_ERR, "DAGAddRunOp(NULL op) fails");
    CHECK(RedisAI_DAGAddRunOp(NULL, op, err) == REDISMODULE_ERR, "DAGAddRunOp(NULL DAG) fails (the op stays ours)");
    CHECK(RedisAI_DAGLoadTensor(run, NULL, a) == REDISMODULE_ERR, "DAGLoadTensor(NULL name) fails");
    CHECK(RedisAI_DAGLoadTensor(run, "x", NULL) == REDISMODULE_ERR, "DAGLoadTensor(NULL tensor) fails");
    CHECK(RedisAI_DAGAddTensorSet(run, NULL, a) == REDISMODULE_ERR, "DAGAddTensorSet(NULL name) fails");
    CHECK(RedisAI_DAGAddTensorSet(run, "x", NULL) == REDISMODULE_ERR, "DAGAddTensorSet(NULL tensor) fails");
    CHECK(RedisAI_DAGAddTensorGet(run, NULL) == REDISMODULE_ERR, "DAGAddTensorGet(NULL name) fails");
    CHECK(RedisAI_DAGAddOpsFromString(run, NULL, err) == REDISMODULE_ERR, "DAGAddOpsFromString(NULL) fails");
    CHECK(RedisAI_DAGNumOps(run) == 0, "nothing refused was added to the DAG");
    CHECK(RedisAI_DAGAddTensorSet(run, "x", a) == REDISMODULE_OK && RedisAI_DAGAddTensorGet(run, "x") == REDISMODULE_OK,
          "a runnable DAG");
    int rc = RedisAI_DAGRun(run, NULL, NULL, err);
    if (rc != REDISMODULE_ERR) run = NULL; /* taken: the run may still use it, so it is leaked */
    CHECK(rc == REDISMODULE_ERR, "DAGRun without a callback fails");
cleanup:
    if (op) RedisAI_DAGRunOpFree(op);
    if (run) RedisAI_DAGFree(run);
    if (err) RedisAI_FreeError(err);
    return !failed[0];
}

static int cmd_nulls(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    if (argc != 1) return RedisModule_WrongArity(ctx);
    char failed[FAILED_LEN] = "";
    RAI_Tensor *a = key_value(ctx, "a{1}", RedisAI_TensorRedisType());
    RAI_Model *model = key_value(ctx, "m{1}", RedisAI_ModelRedisType());
    RAI_Script *script = key_value(ctx, "myscript{1}", RedisAI_ScriptRedisType());
    CHECK(a && model && script, "a{1}, m{1} and myscript{1} in the keyspace");
    (void)(nulls_errors_tensors(a, failed) && nulls_models(ctx, model, a, failed) &&
           nulls_scripts(ctx, script, a, failed) && nulls_dags(model, script, a, failed));
    CHECK(no_unexpected_callbacks(), "no callback for runs refused with NULL arguments");
cleanup:
    return reply_result(ctx, failed);
}

/* ============================================================================================================ */

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "llapi_test", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    /* without every function of the API this module is useless: fail the load (RedisAI_Initialize logs which) */
    if (RedisAI_Initialize(ctx) != REDISMODULE_OK) return REDISMODULE_ERR;

    static const struct {
        const char *name;
        RedisModuleCmdFunc fn;
        const char *flags;
        int first, last, step;
    } commands[] = {
        {"LLAPI.VERSION", cmd_version, "readonly", 0, 0, 0},
        {"LLAPI.ERRORS", cmd_errors, "readonly", 0, 0, 0},
        {"LLAPI.TENSORS", cmd_tensors, "readonly", 1, 1, 1},
        {"LLAPI.MODELRUN", cmd_modelrun, "readonly", 0, 0, 0},
        {"LLAPI.FAILTHENRUN", cmd_failthenrun, "readonly", 0, 0, 0},
        {"LLAPI.MODELCREATE", cmd_modelcreate, "readonly", 0, 0, 0},
        {"LLAPI.SCRIPTRUN", cmd_scriptrun, "readonly", 0, 0, 0},
        {"LLAPI.DAGRUN", cmd_dagrun, "readonly", 0, 0, 0},
        {"LLAPI.DAG_MULTIDEVICE", cmd_dag_multidevice, "readonly", 0, 0, 0},
        {"LLAPI.REFCOUNT", cmd_refcount, "write", 0, 0, 0}, /* deletes tmp{1} and mtmp{1} */
        {"LLAPI.NULLS", cmd_nulls, "readonly", 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (RedisModule_CreateCommand(ctx, commands[i].name, commands[i].fn, commands[i].flags, commands[i].first,
                                      commands[i].last, commands[i].step) == REDISMODULE_ERR) {
            return REDISMODULE_ERR;
        }
    }
    return REDISMODULE_OK;
}
