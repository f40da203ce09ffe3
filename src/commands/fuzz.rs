//! Property tests: every parser takes any argv, and every RDB decoder any payload, without panicking
//! (arguments are drawn from the commands' own keywords mixed with numbers and junk).

use proptest::prelude::*;
use std::sync::Arc;

use super::{config, dag, model, script, tensor};
use crate::error::{Error, Result};
use crate::rdb::{load_model, load_script, load_tensor, MemItem, MemRdb};
use crate::tensor::Tensor;

const WORDS: &[&str] = &[
    "AI.TENSORSET",
    "AI.TENSORGET",
    "AI.MODELEXECUTE",
    "AI.MODELRUN",
    "AI.SCRIPTEXECUTE",
    "AI.SCRIPTRUN",
    "|>",
    "LOAD",
    "PERSIST",
    "ROUTING",
    "TIMEOUT",
    "INPUTS",
    "OUTPUTS",
    "KEYS",
    "ARGS",
    "BLOB",
    "VALUES",
    "META",
    "SOURCE",
    "TAG",
    "BATCHSIZE",
    "MINBATCHSIZE",
    "MINBATCHTIMEOUT",
    "ENTRY_POINTS",
    "$",
    "FLOAT",
    "INT8",
    "STRING",
    "BOOL",
    "ONNX",
    "TF",
    "TORCH",
    "CPU",
    "CPU:1",
    "GPU",
    "0",
    "1",
    "2",
    "3",
    "16",
    "-1",
    "1.5",
    "nan",
    "x",
    "m",
    "a",
    "18446744073709551616",
    "9223372036854775807",
    "GET",
    "MODEL_CHUNK_SIZE",
    "BACKENDSPATH",
    "LOADBACKEND",
];

fn arg() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => proptest::sample::select(WORDS).prop_map(|w| w.as_bytes().to_vec()),
        1 => proptest::collection::vec(any::<u8>(), 0..12),
    ]
}

fn argv(first: &'static str) -> impl Strategy<Value = Vec<Vec<u8>>> {
    proptest::collection::vec(arg(), 0..24).prop_map(move |mut v| {
        v.insert(0, first.as_bytes().to_vec());
        v
    })
}

fn refs(v: &[Vec<u8>]) -> Vec<&[u8]> {
    v.iter().map(Vec::as_slice).collect()
}

/// Keys resolve to small tensors; models and scripts do not exist (their parsers stop there).
struct Fake;
impl dag::Resolver for Fake {
    fn tensor(&self, key: &[u8]) -> Result<Arc<Tensor>> {
        if key == b"a" {
            Ok(Arc::new(Tensor::zeros(crate::tensor::DataType::Float, vec![2])?))
        } else {
            Err(Error::TensorKeyEmpty)
        }
    }
    fn model(&self, _key: &[u8]) -> Result<Arc<crate::model::Model>> {
        Err(Error::ModelKeyEmpty)
    }
    fn script(&self, _key: &[u8]) -> Result<Arc<crate::script::Script>> {
        Err(Error::ScriptKeyEmpty)
    }
}

/// 3,000 cases in `make test`; PROPTEST_CASES (set by `make fuzz`) wins when given. A literal `cases` alone would
/// override the variable, so `make fuzz` would silently run 3,000 too; read it here. Every property test of the
/// crate uses this.
pub(crate) fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn tensor_parsers(v in argv("AI.TENSORSET")) {
        let a = refs(&v);
        let _ = tensor::parse_tensorset(&a, &|_| None);
        let _ = tensor::parse_tensorget_format(&a[1..]);
    }

    #[test]
    fn model_parsers(v in argv("AI.MODELSTORE"), ni in 0usize..4, no in 0usize..4) {
        let a = refs(&v);
        let _ = model::parse_modelstore(&a);
        let _ = model::parse_modelset(&a);
        let _ = config::parse_config(&a);
        assert!(model::modelexecute_key_positions(&a).iter().all(|&(k, _)| k < a.len()));
        assert!(model::modelrun_key_positions(&a).iter().all(|&(k, _)| k < a.len()));
        if a.len() >= 3 {
            let _ = model::parse_modelexecute(&a, ni, no);
            let _ = model::parse_modelrun(&a, ni, no);
        }
    }

    #[test]
    fn script_parsers(v in argv("AI.SCRIPTEXECUTE")) {
        let a = refs(&v);
        let _ = script::parse_scriptstore(&a);
        let _ = script::parse_scriptset(&a);
        assert!(script::scriptexecute_key_positions(&a).iter().all(|&(k, _)| k < a.len()));
        assert!(script::scriptrun_key_positions(&a).iter().all(|&(k, _)| k < a.len()));
        if a.len() >= 3 {
            let _ = script::parse_scriptexecute(&a, false);
            let _ = script::parse_scriptexecute(&a, true);
            let _ = script::parse_scriptrun(&a);
        }
    }

    #[test]
    fn dag_parser(v in argv("AI.DAGEXECUTE")) {
        let a = refs(&v);
        for kind in [dag::DagKind::Execute, dag::DagKind::ExecuteRo, dag::DagKind::Run, dag::DagKind::RunRo] {
            let _ = dag::parse_dag(&a, kind, &Fake);
        }
        assert!(dag::dag_key_positions(&a).iter().all(|&(k, _)| k < a.len()));
    }

    #[test]
    fn rdb_decoders(items in proptest::collection::vec(prop_oneof![
        3 => prop_oneof![0u64..20, any::<u64>()].prop_map(MemItem::Unsigned),
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(MemItem::Buffer),
    ], 0..40), encver in 0i32..6) {
        let _ = load_tensor(&mut MemRdb::new(items.clone()), encver);
        let _ = load_model(&mut MemRdb::new(items.clone()), encver);
        let _ = load_script(&mut MemRdb::new(items), encver);
    }
}
