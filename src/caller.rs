//! Whom a run acts for, carried in every run request (backends::RunRequest, ScriptRequest): a leaf, so that the
//! backends, the engine and the callbacks all name it.

use std::sync::Arc;

/// Whom a run acts for: what scripts' `redis.execute` and `redisAI.model_execute` (and TorchScript models that
/// call them) run as. Callbacks act with the client's ACL user, never as the module's superuser context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client's database.
    pub db: i32,
    /// The client's ACL user name; `None` (not looked up: the run has no TorchScript) makes callbacks refuse.
    pub user: Option<Arc<[u8]>>,
    /// The command was read-only (AI.DAGEXECUTE_RO, AI.DAGRUN_RO): callbacks may not write.
    pub read_only: bool,
}

thread_local! {
    /// The caller of the request whose op runs on this thread.
    static CALLER: std::cell::RefCell<Caller> = std::cell::RefCell::new(Caller::default());
}

/// While it lives, `caller` is the caller that script callbacks of this thread act for: how a backend in this
/// process hands a request's caller to the callbacks its TorchScript code makes on the same thread. The one
/// before comes back when it is dropped, also on unwinding.
pub struct Scope(Option<Caller>);

impl Scope {
    pub fn new(caller: &Caller) -> Scope {
        Scope(Some(CALLER.with(|c| c.replace(caller.clone()))))
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        if let Some(old) = self.0.take() {
            CALLER.with(|c| *c.borrow_mut() = old);
        }
    }
}

pub fn current_caller() -> Caller {
    CALLER.with(|c| c.borrow().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_sets_the_caller_and_gives_the_old_one_back() {
        let a = Caller { db: 3, user: Some(Arc::from(&b"alice"[..])), read_only: true };
        assert_eq!(current_caller(), Caller::default());
        {
            let _s = Scope::new(&a);
            assert_eq!(current_caller(), a);
            let b = Caller { db: 1, ..Caller::default() };
            let r = std::panic::catch_unwind(|| {
                let _inner = Scope::new(&b);
                panic!("unwinds through the scope");
            });
            assert!(r.is_err());
            assert_eq!(current_caller(), a, "restored on unwinding");
        }
        assert_eq!(current_caller(), Caller::default());
    }
}
