//! nvlists: owned ([`NvList`]) and borrowed ([`NvListRef`]) name-value lists.
use super::*;

/// An owned `nvlist_t`, freed on drop.
#[derive(Debug)]
pub(crate) struct NvList(NonNull<z::nvlist_t>);

// SAFETY: the list is owned, never shared; moving it between threads is fine
// (libnvpair keeps no per-thread state). It is not Sync: nvlists are not
// synchronised.
unsafe impl Send for NvList {}

impl NvList {
    /// A new empty list with unique names.
    pub fn new() -> Result<Self, c_int> {
        let mut p: *mut z::nvlist_t = ptr::null_mut();
        // SAFETY: p receives a newly allocated list on success.
        let rc = unsafe { z::nvlist_alloc(&mut p, z::NV_UNIQUE_NAME, 0) };
        errno(rc)?;
        NonNull::new(p).map(NvList).ok_or(EINVAL)
    }

    /// Unpacks a list the kernel packed (`nvlist_unpack`).
    pub fn unpack(packed: &[u8]) -> Result<Self, c_int> {
        let mut p: *mut z::nvlist_t = ptr::null_mut();
        // SAFETY: the buffer is live and only read for its length; p
        // receives a new list we own on success.
        let rc =
            unsafe { z::nvlist_unpack(packed.as_ptr().cast_mut().cast(), packed.len(), &mut p, 0) };
        errno(rc)?;
        NonNull::new(p).map(NvList).ok_or(EINVAL)
    }

    /// Takes ownership of `p` (NULL gives `None`).
    ///
    /// # Safety
    /// `p` is NULL or a list the caller owns and hands over.
    pub(super) unsafe fn from_raw(p: *mut z::nvlist_t) -> Option<Self> {
        NonNull::new(p).map(NvList)
    }

    pub fn as_ptr(&self) -> *mut z::nvlist_t {
        self.0.as_ptr()
    }

    /// A borrowed view for reading.
    pub fn as_ref(&self) -> NvListRef<'_> {
        NvListRef(self.0, PhantomData)
    }

    /// Adds `key = value` (uint64).
    pub fn add_u64(&mut self, key: &str, value: u64) -> Result<(), c_int> {
        let k = cstring(key)?;
        // SAFETY: the list is live and exclusively ours; the key is copied.
        errno(unsafe { z::nvlist_add_uint64(self.as_ptr(), k.as_ptr(), value) })
    }

    /// Adds `key = value` (string).
    pub fn add_string(&mut self, key: &str, value: &str) -> Result<(), c_int> {
        let k = cstring(key)?;
        let v = cstring(value)?;
        // SAFETY: as add_u64; the value is copied too.
        errno(unsafe { z::nvlist_add_string(self.as_ptr(), k.as_ptr(), v.as_ptr()) })
    }

    /// Adds `key = list` (copied), as the kernel nests a property's value
    /// and source.
    #[cfg(test)]
    pub fn add_list(&mut self, key: &str, list: &NvList) -> Result<(), c_int> {
        let k = cstring(key)?;
        // SAFETY: both lists are live; the added one is copied.
        errno(unsafe { z::nvlist_add_nvlist(self.as_ptr(), k.as_ptr(), list.as_ptr()) })
    }

    /// The list packed in the native encoding, as the kernel packs the
    /// lists it hands out.
    #[cfg(test)]
    pub fn pack(&self) -> Result<Vec<u8>, c_int> {
        let mut buf: *mut c_char = ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: the list is live; libnvpair allocates `buf` (malloc) for
        // `len` bytes, copied out and freed below.
        let rc = unsafe { z::nvlist_pack(self.as_ptr(), &mut buf, &mut len, 0, 0) };
        errno(rc)?;
        // SAFETY: on success `buf` holds `len` bytes, ours to free.
        let out = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }.to_vec();
        // SAFETY: allocated by libnvpair with malloc for us; freed once.
        unsafe { libc_free(buf.cast()) };
        Ok(out)
    }

    /// Adds `key` as a boolean flag (how snapshot lists name their members).
    pub fn add_boolean(&mut self, key: &str) -> Result<(), c_int> {
        let k = cstring(key)?;
        // SAFETY: as add_u64.
        errno(unsafe { z::nvlist_add_boolean(self.as_ptr(), k.as_ptr()) })
    }
}

#[cfg(test)]
// SAFETY: C's `free`, declared with its own signature; called only on
// memory libnvpair allocated with malloc.
unsafe extern "C" {
    #[link_name = "free"]
    fn libc_free(p: *mut c_void);
}

impl Drop for NvList {
    fn drop(&mut self) {
        // SAFETY: we own the list and free it once.
        unsafe { z::nvlist_free(self.as_ptr()) }
    }
}

/// A value read from an nvlist.
#[derive(Debug)]
pub(crate) enum NvValue<'a> {
    I32(i32),
    Str(String),
    List(NvListRef<'a>),
    Other,
}

/// A borrowed `nvlist_t`, alive as long as `'a`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NvListRef<'a>(
    pub(super) NonNull<z::nvlist_t>,
    pub(super) PhantomData<&'a ()>,
);

impl<'a> NvListRef<'a> {
    /// Every pair, in the list's order.
    pub fn entries(&self) -> Vec<(String, NvValue<'a>)> {
        let mut out = Vec::new();
        let mut pair: *mut z::nvpair_t = ptr::null_mut();
        loop {
            // SAFETY: the list is alive for 'a; pair is NULL or the previous
            // pair of this list.
            pair = unsafe { z::nvlist_next_nvpair(self.0.as_ptr(), pair) };
            if pair.is_null() {
                break;
            }
            // SAFETY: pair is a live pair of the list; the values read are
            // copied out, or (nested lists) borrowed for 'a.
            let (name, value) = unsafe {
                let name = owned(z::nvpair_name(pair));
                let value = match z::nvpair_type(pair) {
                    z::DATA_TYPE_INT32 => {
                        let mut v = 0i32;
                        if z::nvpair_value_int32(pair, &mut v) == 0 {
                            NvValue::I32(v)
                        } else {
                            NvValue::Other
                        }
                    }
                    z::DATA_TYPE_STRING => {
                        let mut v: *const c_char = ptr::null();
                        if z::nvpair_value_string(pair, &mut v) == 0 {
                            NvValue::Str(owned(v))
                        } else {
                            NvValue::Other
                        }
                    }
                    z::DATA_TYPE_NVLIST => {
                        let mut v: *mut z::nvlist_t = ptr::null_mut();
                        if z::nvpair_value_nvlist(pair, &mut v) == 0 {
                            NonNull::new(v)
                                .map(|p| NvValue::List(NvListRef(p, PhantomData)))
                                .unwrap_or(NvValue::Other)
                        } else {
                            NvValue::Other
                        }
                    }
                    _ => NvValue::Other,
                };
                (name, value)
            };
            out.push((name, value));
        }
        out
    }

    /// The nested list named `key`, if there is one.
    pub fn list(&self, key: &CStr) -> Option<NvListRef<'a>> {
        let mut v: *mut z::nvlist_t = ptr::null_mut();
        // SAFETY: the list is alive for 'a and the key NUL-terminated; the
        // nested list found is part of it, borrowed for 'a.
        let rc = unsafe { z::nvlist_lookup_nvlist(self.0.as_ptr(), key.as_ptr(), &mut v) };
        (rc == 0)
            .then(|| NonNull::new(v).map(|p| NvListRef(p, PhantomData)))
            .flatten()
    }

    /// The uint64 named `key`, if there is one.
    pub fn u64(&self, key: &CStr) -> Option<u64> {
        let mut v = 0u64;
        // SAFETY: the list is alive and the key NUL-terminated; the value
        // is copied out.
        let rc = unsafe { z::nvlist_lookup_uint64(self.0.as_ptr(), key.as_ptr(), &mut v) };
        (rc == 0).then_some(v)
    }

    /// The int32 pairs (error lists map names to errno values).
    pub fn int32_entries(&self) -> Vec<(String, i32)> {
        self.entries()
            .into_iter()
            .filter_map(|(k, v)| match v {
                NvValue::I32(e) => Some((k, e)),
                _ => None,
            })
            .collect()
    }
}
