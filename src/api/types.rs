//! Argument types the API needs that pgrx does not map the way we want.
use pgrx::callconv::{Arg, ArgAbi};
use pgrx::prelude::*;
use pgrx::{impl_sql_translatable, pg_sys};

/// A `jsonb` argument taken as PostgreSQL's own text rendering (jsonb_out),
/// exactly what `payload::text` gives: no serde round trip.
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
        let cstr = unsafe {
            pgrx::direct_function_call::<&core::ffi::CStr>(pg_sys::jsonb_out, &[Some(datum)])
        }
        .expect("jsonb_out returned NULL");
        Some(JsonbText(cstr.to_string_lossy().into_owned()))
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

/// A `jsonb[]` argument rendered element by element as text (NULL stays NULL).
#[derive(Debug)]
pub struct JsonbTextArray(pub Vec<Option<String>>);

impl FromDatum for JsonbTextArray {
    unsafe fn from_polymorphic_datum(
        datum: pg_sys::Datum,
        is_null: bool,
        _: pg_sys::Oid,
    ) -> Option<JsonbTextArray> {
        if is_null {
            return None;
        }
        // Deconstruct the array and render each element with jsonb_out.
        unsafe {
            let arr = pg_sys::pg_detoast_datum(datum.cast_mut_ptr()) as *mut pg_sys::ArrayType;
            let mut elems: *mut pg_sys::Datum = std::ptr::null_mut();
            let mut nulls: *mut bool = std::ptr::null_mut();
            let mut n: i32 = 0;
            pg_sys::deconstruct_array(
                arr,
                pg_sys::JSONBOID,
                -1,
                false,
                pg_sys::TYPALIGN_INT as core::ffi::c_char,
                &mut elems,
                &mut nulls,
                &mut n,
            );
            let mut out = Vec::with_capacity(n as usize);
            for i in 0..n as usize {
                if *nulls.add(i) {
                    out.push(None);
                } else {
                    let cstr = pgrx::direct_function_call::<&core::ffi::CStr>(
                        pg_sys::jsonb_out,
                        &[Some(*elems.add(i))],
                    )
                    .expect("jsonb_out returned NULL");
                    out.push(Some(cstr.to_string_lossy().into_owned()));
                }
            }
            Some(JsonbTextArray(out))
        }
    }
}

unsafe impl<'fcx> ArgAbi<'fcx> for JsonbTextArray {
    unsafe fn unbox_arg_unchecked(arg: Arg<'_, 'fcx>) -> Self {
        unsafe { arg.unbox_arg_using_from_datum() }.expect("jsonb[] argument must not be NULL")
    }
    unsafe fn unbox_nullable_arg(arg: Arg<'_, 'fcx>) -> pgrx::nullable::Nullable<Self> {
        unsafe { arg.unbox_arg_using_from_datum::<JsonbTextArray>() }.into()
    }
}

impl_sql_translatable!(JsonbTextArray, arg_only = "jsonb[]");

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
