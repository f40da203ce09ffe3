//! Points one loaded library's calls to named functions (`malloc`, `operator new`, …) at replacements, and
//! nobody else's: a shared library calls an imported function through a slot of its global offset table that
//! the dynamic linker filled (a `JUMP_SLOT`, `GLOB_DAT` or absolute relocation naming the symbol); rewriting
//! those slots changes what that library calls. The slots are found from the library's own dynamic section
//! (`dl_iterate_phdr`), so nothing is read from disk and any build or file name works.

use std::ffi::{c_int, c_void};

/// `Elf64_Rela`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Rela {
    pub offset: u64,
    pub info: u64,
    pub addend: i64,
}

/// `Elf64_Dyn`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Dyn {
    tag: i64,
    val: u64,
}

/// `Elf64_Sym`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Sym {
    name: u32,
    info: u8,
    other: u8,
    shndx: u16,
    value: u64,
    size: u64,
}

const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_RELAENT: i64 = 9;
const DT_STRSZ: i64 = 10;
const DT_SYMENT: i64 = 11;
const DT_PLTREL: i64 = 20;
const DT_JMPREL: i64 = 23;

#[cfg(target_arch = "x86_64")]
const BINDS_ADDRESS: [u32; 3] = [7 /* JUMP_SLOT */, 6 /* GLOB_DAT */, 1 /* 64 */];
#[cfg(target_arch = "aarch64")]
const BINDS_ADDRESS: [u32; 3] = [1026 /* JUMP_SLOT */, 1025 /* GLOB_DAT */, 257 /* ABS64 */];
// Elsewhere nothing is found, and the caller refuses the library.
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
const BINDS_ADDRESS: [u32; 0] = [];

/// One slot to rewrite: its offset from the library's load address, and which replacement goes there.
#[derive(Debug, PartialEq, Eq)]
pub struct Patch {
    pub offset: u64,
    pub which: usize,
}

/// The slots among `relocs` that hold the address of one of `names` (nothing added to it), `name_of` giving a
/// symbol index's name. Other relocations (relative ones, data symbols, an address plus an offset) are left.
pub fn plan<'a>(relocs: &[Rela], name_of: impl Fn(u32) -> Option<&'a [u8]>, names: &[&str]) -> Vec<Patch> {
    let mut patches = Vec::new();
    for r in relocs {
        let (kind, sym) = ((r.info & 0xffff_ffff) as u32, (r.info >> 32) as u32);
        if sym == 0 || r.addend != 0 || !BINDS_ADDRESS.contains(&kind) {
            continue;
        }
        let Some(name) = name_of(sym) else { continue };
        if let Some(which) = names.iter().position(|n| n.as_bytes() == name) {
            patches.push(Patch { offset: r.offset, which });
        }
    }
    patches
}

/// A segment of the loaded object, in its own addresses (add `base`).
#[derive(Clone, Copy)]
struct Segment {
    kind: u32,
    flags: u32,
    vaddr: u64,
    memsz: u64,
}

struct Object {
    base: u64,
    segments: Vec<Segment>,
}

impl Object {
    fn contains(&self, addr: u64, len: u64, pred: impl Fn(&Segment) -> bool) -> bool {
        self.segments.iter().any(|s| {
            let start = self.base.wrapping_add(s.vaddr);
            pred(s) && addr >= start && addr.checked_add(len).is_some_and(|end| end <= start.wrapping_add(s.memsz))
        })
    }

    fn loaded(&self, addr: u64, len: u64) -> bool {
        self.contains(addr, len, |s| s.kind == libc::PT_LOAD)
    }

    /// Whether the word at `addr` is in the part of RELRO the dynamic linker made read-only: whole pages only
    /// (it rounds the end down, so a last partial page stays writable and must stay so).
    fn read_only(&self, addr: u64, page: u64) -> bool {
        self.segments.iter().any(|s| {
            let start = self.base.wrapping_add(s.vaddr);
            let end = start.wrapping_add(s.memsz) & !(page - 1);
            s.kind == libc::PT_GNU_RELRO && addr >= start & !(page - 1) && addr.saturating_add(8) <= end
        })
    }

    fn writable(&self, addr: u64) -> bool {
        self.contains(addr, 8, |s| s.kind == libc::PT_LOAD && s.flags & libc::PF_W != 0)
    }

    /// A dynamic-section address: glibc rewrites some entries to run-time addresses, others stay file
    /// addresses; either way the result must lie in the object.
    fn resolve(&self, val: u64, len: u64) -> Result<u64, String> {
        let addr = if val >= self.base { val } else { self.base.wrapping_add(val) };
        if len > 0 && !self.loaded(addr, len) {
            return Err(format!("a dynamic-section table ({val:#x}, {len} bytes) lies outside the library"));
        }
        Ok(addr)
    }
}

struct Search {
    target: u64,
    found: Option<Object>,
}

unsafe extern "C" fn find_object(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: `data` is the `Search` `interpose` passed; `info` and its program headers are valid during this
    // callback (dl_iterate_phdr's contract) and only copied out.
    unsafe {
        let search = &mut *(data as *mut Search);
        let info = &*info;
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        let headers = std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize);
        let object = Object {
            base: info.dlpi_addr,
            segments: headers
                .iter()
                .map(|h| Segment { kind: h.p_type, flags: h.p_flags, vaddr: h.p_vaddr, memsz: h.p_memsz })
                .collect(),
        };
        if object.loaded(search.target, 1) {
            search.found = Some(object);
            return 1;
        }
        0
    }
}

/// Rewrites the slots through which the loaded library that contains `inside` (the address of any of its
/// functions) reaches each `(name, replacement)`; returns the names it found and rewrote. Call it before the
/// library's functions run on other threads (a slot is one aligned word: a call made meanwhile goes to the old
/// or the new function).
/// # Safety
/// Each replacement must be a function with the ABI and contract of the function it replaces, for the
/// process's lifetime; the library must stay loaded.
pub unsafe fn interpose<'a>(inside: *const c_void, replacements: &[(&'a str, usize)]) -> Result<Vec<&'a str>, String> {
    let mut search = Search { target: inside as u64, found: None };
    // SAFETY: the callback matches dl_iterate_phdr's signature and `search` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(find_object), &mut search as *mut Search as *mut c_void) };
    let object = search.found.ok_or("the library is not among the loaded objects")?;
    let dynamic = object
        .segments
        .iter()
        .find(|s| s.kind == libc::PT_DYNAMIC)
        .copied()
        .ok_or("the library has no dynamic section")?;
    let dyn_addr = object.base.wrapping_add(dynamic.vaddr);
    if !object.loaded(dyn_addr, dynamic.memsz) {
        return Err("the dynamic section lies outside the library".into());
    }
    // SAFETY: the dynamic section lies in the object's loaded memory (checked above) and is an array of
    // Elf64_Dyn entries (the ELF format); it is read, never written.
    let entries = unsafe {
        std::slice::from_raw_parts(dyn_addr as *const Dyn, dynamic.memsz as usize / std::mem::size_of::<Dyn>())
    };
    let mut table = [0u64; 24];
    for e in entries.iter().take_while(|e| e.tag != DT_NULL) {
        if let Some(slot) = usize::try_from(e.tag).ok().and_then(|t| table.get_mut(t)) {
            *slot = e.val;
        }
    }
    let get = |tag: i64| table[tag as usize];
    if get(DT_JMPREL) != 0 && get(DT_PLTREL) != DT_RELA as u64 {
        return Err("the library's PLT relocations are not RELA".into());
    }
    if get(DT_RELAENT) != 0 && get(DT_RELAENT) != std::mem::size_of::<Rela>() as u64
        || get(DT_SYMENT) != 0 && get(DT_SYMENT) != std::mem::size_of::<Sym>() as u64
    {
        return Err("unexpected ELF entry sizes".into());
    }
    let strsz = get(DT_STRSZ);
    let strtab = object.resolve(get(DT_STRTAB), strsz)?;
    let symtab = object.resolve(get(DT_SYMTAB), std::mem::size_of::<Sym>() as u64)?;
    let mut relocs: Vec<Rela> = Vec::new();
    for (at, size) in [(DT_JMPREL, DT_PLTRELSZ), (DT_RELA, DT_RELASZ)] {
        let (addr, size) = (get(at), get(size));
        if addr == 0 || size == 0 {
            continue;
        }
        let addr = object.resolve(addr, size)?;
        // SAFETY: the table lies in the object's loaded memory (`resolve` checked it) and holds Elf64_Rela entries.
        relocs.extend_from_slice(unsafe {
            std::slice::from_raw_parts(addr as *const Rela, size as usize / std::mem::size_of::<Rela>())
        });
    }
    let name_of = |index: u32| -> Option<&'static [u8]> {
        let at = symtab.checked_add(u64::from(index) * std::mem::size_of::<Sym>() as u64)?;
        if !object.loaded(at, std::mem::size_of::<Sym>() as u64) {
            return None;
        }
        // SAFETY: the entry lies in the object's loaded memory (checked above); the name is read within the
        // string table's DT_STRSZ bytes, which lie in the object too (checked by `resolve`).
        unsafe {
            let sym = (at as *const Sym).read_unaligned();
            let start = u64::from(sym.name);
            if start >= strsz {
                return None;
            }
            let rest = std::slice::from_raw_parts((strtab + start) as *const u8, (strsz - start) as usize);
            Some(&rest[..rest.iter().position(|&b| b == 0)?])
        }
    };
    let names: Vec<&str> = replacements.iter().map(|r| r.0).collect();
    let patches = plan(&relocs, name_of, &names);
    let page = 4096u64.max(
        // SAFETY: sysconf has no preconditions.
        unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64,
    );
    let mut done = Vec::new();
    for p in &patches {
        let slot = object.base.wrapping_add(p.offset);
        if slot % 8 != 0 {
            return Err(format!("a relocation slot at {slot:#x} is not aligned"));
        }
        let relro = object.read_only(slot, page);
        if !object.loaded(slot, 8) || !relro && !object.writable(slot) {
            return Err(format!("a relocation slot at {slot:#x} is not in the library's data"));
        }
        let start = slot & !(page - 1);
        // SAFETY: the slot is an aligned word of the library's relocated data (checked above): a GOT entry the
        // dynamic linker wrote the function's address into. A read-only (RELRO) page is made writable for the
        // store and read-only again. The store is atomic, so a concurrent call goes to one function or the other.
        unsafe {
            if relro && libc::mprotect(start as *mut c_void, page as usize, libc::PROT_READ | libc::PROT_WRITE) != 0 {
                return Err(format!("mprotect: {}", std::io::Error::last_os_error()));
            }
            (*(slot as *const std::sync::atomic::AtomicUsize))
                .store(replacements[p.which].1, std::sync::atomic::Ordering::SeqCst);
            if relro {
                libc::mprotect(start as *mut c_void, page as usize, libc::PROT_READ);
            }
        }
        let name = replacements[p.which].0;
        if !done.contains(&name) {
            done.push(name);
        }
    }
    Ok(done)
}

#[cfg(test)]
const NAMES: &[&str] = &[
    "malloc",
    "calloc",
    "realloc",
    "free",
    "aligned_alloc",
    "posix_memalign",
    "memalign",
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn rela(offset: u64, kind: u32, sym: u32, addend: i64) -> Rela {
        Rela { offset, info: (u64::from(sym) << 32) | u64::from(kind), addend }
    }

    #[test]
    fn plan_takes_only_address_slots_of_the_named_symbols() {
        let [jump, glob, abs] = BINDS_ADDRESS;
        let symbols: [&[u8]; 6] = [b"", b"malloc", b"free", b"memcpy", b"_Znwm", b"calloc"];
        let relocs = [
            rela(0x1000, jump, 1, 0),  // malloc through the PLT
            rela(0x1008, glob, 2, 0),  // free's address loaded (e.g. a deleter)
            rela(0x1010, jump, 3, 0),  // memcpy: not asked for
            rela(0x1018, abs, 4, 0),   // operator new's address in data
            rela(0x1020, abs, 5, 16),  // calloc + 16: not the function
            rela(0x1028, 8, 0, 0x500), // a relative relocation (no symbol)
            rela(0x1030, 42, 1, 0),    // some other kind naming malloc
            rela(0x1038, jump, 9, 0),  // a symbol index the table does not have
        ];
        let name_of = |i: u32| symbols.get(i as usize).copied();
        let got = plan(&relocs, name_of, &["free", "malloc", "_Znwm", "calloc"]);
        assert_eq!(
            got,
            vec![
                Patch { offset: 0x1000, which: 1 },
                Patch { offset: 0x1008, which: 0 },
                Patch { offset: 0x1018, which: 2 }
            ]
        );
        assert!(plan(&relocs, name_of, &[]).is_empty());
    }

    #[test]
    fn read_only_is_the_whole_pages_of_relro() {
        let seg = |kind, flags, vaddr, memsz| Segment { kind, flags, vaddr, memsz };
        let object = Object {
            base: 0x7f00_0000_0000,
            segments: vec![
                seg(libc::PT_LOAD, 4, 0, 0x5000),                   // text, read-only
                seg(libc::PT_LOAD, 6, 0x6440, 0x3000),              // data, RW
                seg(libc::PT_GNU_RELRO, 4, 0x6440, 0x1bc0 + 0x100), // RELRO ends at 0x8100: page 0x8000 stays RW
            ],
        };
        let at = |off: u64| object.base + off;
        assert!(object.read_only(at(0x6448), 0x1000), "first (partial) page: protected, rounded down");
        assert!(object.read_only(at(0x7ff8), 0x1000));
        assert!(!object.read_only(at(0x8000), 0x1000), "the last partial page is left writable");
        assert!(object.writable(at(0x8000)) && object.writable(at(0x9438)));
        assert!(!object.writable(at(0x9440)), "past the data segment");
        assert!(!object.writable(at(0x1000)), "text");
        assert!(object.resolve(0x6440, 16).is_ok_and(|a| a == at(0x6440)), "a file address");
        assert!(object.resolve(at(0x6440), 16).is_ok_and(|a| a == at(0x6440)), "a run-time address");
        assert!(object.resolve(0x9000, 0x1000).is_err(), "outside the library");
    }

    /// Over the real library: its allocation imports are found (nothing is rewritten here).
    #[test]
    fn finds_litert_allocation_imports() {
        let Some(dir) = option_env!("REDISAI_TFLITE_LIB_DIR") else { return };
        let path = format!("{dir}/libLiteRt.so");
        if !std::path::Path::new(&path).exists() {
            return;
        }
        // SAFETY: loading LiteRT runs its initialisers, which is all this test does with it; it stays loaded.
        let lib = unsafe { libloading::Library::new(&path) }.expect("open libLiteRt.so");
        // SAFETY: the symbol is a function of LiteRT's C API; only its address is used.
        let f = unsafe { lib.get::<unsafe extern "C" fn()>(b"LiteRtCreateEnvironment\0") }.expect("symbol");
        let inside = *f as *const c_void;
        // Each name maps to the function LiteRT is bound to already (dlsym through its handle searches it and
        // its dependencies), so interposing changes nothing.
        let own: Vec<(&str, usize)> = NAMES
            .iter()
            .filter_map(|n| {
                let name = format!("{n}\0");
                // SAFETY: only the symbol's address is taken.
                let sym = unsafe { lib.get::<*const c_void>(name.as_bytes()) }.ok()?;
                Some((*n, *sym as usize))
            })
            .collect();
        std::mem::forget(lib);
        // SAFETY: every replacement is the very function the dynamic linker binds for LiteRT.
        let done = unsafe { interpose(inside, &own) }.expect("interpose");
        for name in ["malloc", "calloc", "realloc", "free", "aligned_alloc", "posix_memalign", "_Znwm", "_ZdlPv"] {
            assert!(done.contains(&name), "{name} not found in {done:?}");
        }
    }
}
