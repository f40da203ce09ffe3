//! `dl_api!`: a table of C functions resolved with `dlopen`/`dlsym` from a library path chosen at run time,
//! so that the module loads (and serves everything else) without the backend library.

/// Declares `pub struct Api` (the library plus one function pointer per symbol) and `Api::open(path)`.
/// Each symbol must be declared with the C signature of the library's headers.
macro_rules! dl_api {
    ($($field:ident = $sym:literal : fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// Function pointers resolved from the library; valid while `_lib` is alive (it never unloads).
        pub struct Api {
            _lib: libloading::Library,
            $(pub $field: unsafe extern "C" fn($($arg),*) $(-> $ret)?,)*
        }

        impl Api {
            pub fn open(path: &str) -> Result<Api, String> {
                // SAFETY: loading the backend library runs its static initialisers, which is what it is
                // for; each symbol is then read with the C signature declared above from its headers.
                unsafe {
                    let lib = libloading::Library::new(path).map_err(|e| e.to_string())?;
                    $(let $field = *lib
                        .get::<unsafe extern "C" fn($($arg),*) $(-> $ret)?>(concat!($sym, "\0").as_bytes())
                        .map_err(|e| format!("{}: {e}", $sym))?;)*
                    Ok(Api { _lib: lib, $($field,)* })
                }
            }
        }
    };
}

pub(crate) use dl_api;
