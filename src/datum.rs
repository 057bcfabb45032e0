//! SQL argument types that pgrx does not map the way we want (jsonb taken as
//! its text, arrays as one datum) and interval helpers: shared by the event
//! engine and every SQL entry point.
use pgrx::callconv::{Arg, ArgAbi};
use pgrx::datum::DatumWithOid;
use pgrx::prelude::*;
use pgrx::{impl_sql_translatable, pg_sys};

/// A `jsonb` argument taken as its text, exactly what `payload::text`
/// (jsonb_out) gives, written by crate::jsontext: no serde round trip.
#[derive(Debug)]
pub struct JsonbText(pub String);

impl FromDatum for JsonbText {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<JsonbText> {
        if is_null {
            return None;
        }
        let mut out = Vec::new();
        unsafe {
            let jb = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *const u8;
            crate::jsontext::append_jsonb_text(&mut out, jb);
        }
        Some(JsonbText(String::from_utf8(out).unwrap_or_else(|e| {
            String::from_utf8_lossy(e.as_bytes()).into_owned()
        })))
    }
}

unsafe impl<'fcx> ArgAbi<'fcx> for JsonbText {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        unsafe { arg.unbox_arg_using_from_datum() }.expect("jsonb argument must not be NULL")
    }
    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum::<JsonbText>() }.into()
    }
}

impl_sql_translatable!(JsonbText, arg_only = "jsonb");

/// An array argument kept as PostgreSQL's own (detoasted) array datum and
/// handed to SPI as it is: a batch of payloads is unnested and cast by the
/// statement that inserts it, never copied element by element into Rust
/// strings and back (measured: ~2 us per event of send_batch's ~11 us beyond
/// building the payload, at 100 events of ~230 bytes).
#[derive(Debug, Clone, Copy)]
pub struct ArrayDatum {
    pub datum: pg_sys::Datum,
    /// Number of elements (all dimensions).
    pub len: usize,
    /// The array type (e.g. `jsonb[]`), for the SPI parameter.
    pub type_oid: pg_sys::Oid,
}

impl ArrayDatum {
    /// # Safety
    /// `datum` must be a non-NULL array datum of type `type_oid`.
    unsafe fn from_datum(datum: pg_sys::Datum, type_oid: pg_sys::Oid) -> ArrayDatum {
        unsafe {
            let arr = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
            let raw = pgrx::array::RawArray::from_ptr(
                std::ptr::NonNull::new(arr).expect("detoasted array"),
            );
            ArrayDatum {
                datum: pg_sys::Datum::from(arr),
                len: raw.len(),
                type_oid,
            }
        }
    }

    /// The elements (all dimensions, in storage order) and their NULL flags,
    /// palloc'd in the current memory context.
    ///
    /// # Safety
    /// `elem` must be the array's element type, a 4-byte-aligned varlena
    /// (text, jsonb).
    pub unsafe fn elements(&self, elem: pg_sys::Oid) -> (&[pg_sys::Datum], &[bool]) {
        if self.len == 0 {
            return (&[], &[]);
        }
        let mut values: *mut pg_sys::Datum = std::ptr::null_mut();
        let mut nulls: *mut bool = std::ptr::null_mut();
        let mut n: i32 = 0;
        unsafe {
            pg_sys::deconstruct_array(
                self.datum.cast_mut_ptr(),
                elem,
                -1,
                false,
                pg_sys::TYPALIGN_INT as core::ffi::c_char,
                &mut values,
                &mut nulls,
                &mut n,
            );
            (
                std::slice::from_raw_parts(values, n as usize),
                std::slice::from_raw_parts(nulls, n as usize),
            )
        }
    }

    /// The datum as an SPI argument of its array type.
    pub fn arg(&self) -> DatumWithOid<'static> {
        unsafe { pgrx::datum::DatumWithOid::new(self.datum, self.type_oid) }
    }
}

/// Declares a SQL array argument type carried as an [`ArrayDatum`].
macro_rules! array_arg {
    ($name:ident, $oid:expr, $sql:literal) => {
        #[doc = concat!("A `", $sql, "` argument as an [`ArrayDatum`].")]
        #[derive(Debug, Clone, Copy)]
        pub struct $name(pub ArrayDatum);

        impl FromDatum for $name {
            unsafe fn from_polymorphic_datum(
                datum: pg_sys::Datum,
                is_null: bool,
                _: pg_sys::Oid,
            ) -> Option<$name> {
                if is_null {
                    return None;
                }
                Some($name(unsafe { ArrayDatum::from_datum(datum, $oid) }))
            }
        }

        unsafe impl<'fcx> ArgAbi<'fcx> for $name {
            unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
                unsafe { arg.unbox_arg_using_from_datum() }
                    .expect(concat!($sql, " argument must not be NULL"))
            }
            unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
                unsafe { arg.unbox_arg_using_from_datum::<$name>() }.into()
            }
        }

        impl_sql_translatable!($name, arg_only = $sql);
    };
}

array_arg!(JsonbArray, pg_sys::JSONBARRAYOID, "jsonb[]");
array_arg!(TextArray, pg_sys::TEXTARRAYOID, "TEXT[]");

/// Interval to milliseconds (a month counts 30 days, as PostgreSQL's epoch does).
pub fn interval_ms(iv: &pgrx::datum::Interval) -> f64 {
    let days = iv.months() as f64 * 30.0 + iv.days() as f64;
    days * 86_400_000.0 + iv.micros() as f64 / 1000.0
}

/// True for `'infinity'` / `'-infinity'` intervals (PostgreSQL 17+ marks them
/// with every field at its extreme; earlier versions have none).
pub fn interval_is_infinite(iv: &pgrx::datum::Interval) -> bool {
    matches!(iv.months(), i32::MAX | i32::MIN)
        && matches!(iv.days(), i32::MAX | i32::MIN)
        && matches!(iv.micros(), i64::MAX | i64::MIN)
}

/// A duration argument that must be finite and not negative (22023 names
/// `what`); NULL is the caller's business.
pub fn check_nonnegative_interval(iv: &pgrx::datum::Interval, what: &str) {
    if interval_is_infinite(iv) {
        crate::error::raise(
            crate::error::INVALID_PARAMETER_VALUE,
            format!("{what} must be finite"),
        );
    }
    if interval_ms(iv) < 0.0 {
        crate::error::raise(
            crate::error::INVALID_PARAMETER_VALUE,
            format!("{what} must not be negative"),
        );
    }
}

/// A jsonb[] of `elems` (in this order) as an SPI argument; NULL (no array)
/// when every element is None, so a completion without outputs stores none.
pub fn jsonb_array_arg(elems: &[Option<pg_sys::Datum>]) -> DatumWithOid<'static> {
    if elems.iter().all(Option::is_none) {
        return DatumWithOid::null_oid(pg_sys::JSONBARRAYOID);
    }
    unsafe {
        let mut datums: Vec<pg_sys::Datum> = elems
            .iter()
            .map(|e| e.unwrap_or(pg_sys::Datum::from(0)))
            .collect();
        let mut nulls: Vec<bool> = elems.iter().map(Option::is_none).collect();
        let mut dims = [elems.len() as i32];
        let mut lbs = [1i32];
        let a = pg_sys::construct_md_array(
            datums.as_mut_ptr(),
            nulls.as_mut_ptr(),
            1,
            dims.as_mut_ptr(),
            lbs.as_mut_ptr(),
            pg_sys::JSONBOID,
            -1,
            false,
            pg_sys::TYPALIGN_INT as std::ffi::c_char,
        );
        DatumWithOid::new(pg_sys::Datum::from(a), pg_sys::JSONBARRAYOID)
    }
}
