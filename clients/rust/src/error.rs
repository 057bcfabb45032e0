//! Typed errors by SQLSTATE (the codes of pgque's docs/errors.md).

use tokio_postgres::error::SqlState;

/// What a database error means for a pgque call, from its SQLSTATE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 22004: a required argument (or array element) is NULL.
    NullValueNotAllowed,
    /// 42602: an empty name or a forbidden character.
    InvalidName,
    /// 42622: a name over its byte limit.
    NameTooLong,
    /// 42704: unknown queue, consumer, batch, job...
    UndefinedObject,
    /// 22023: an unacceptable value.
    InvalidParameterValue,
    /// 22003: a number outside its range.
    NumericValueOutOfRange,
    /// 22P02: text that is not JSON into a jsonb argument.
    InvalidJson,
    /// 55000: the object is in the wrong state (a finished batch, a slot lease
    /// held by another worker...).
    WrongState,
    /// 23505: a unique key held by a live job, with `on_duplicate = 'error'`.
    DuplicateJob,
    /// 0A000: e.g. a job-log call at REPEATABLE READ.
    FeatureNotSupported,
    /// 42883: the server's pgque has no such function (an older version).
    UndefinedFunction,
    /// Any other database error (connection loss, cancellation...).
    Other,
}

impl ErrorKind {
    /// The kind for a SQLSTATE.
    pub fn from_sqlstate(code: &SqlState) -> ErrorKind {
        match code.code() {
            "22004" => ErrorKind::NullValueNotAllowed,
            "42602" => ErrorKind::InvalidName,
            "42622" => ErrorKind::NameTooLong,
            "42704" => ErrorKind::UndefinedObject,
            "22023" => ErrorKind::InvalidParameterValue,
            "22003" => ErrorKind::NumericValueOutOfRange,
            "22P02" => ErrorKind::InvalidJson,
            "55000" => ErrorKind::WrongState,
            "23505" => ErrorKind::DuplicateJob,
            "0A000" => ErrorKind::FeatureNotSupported,
            "42883" => ErrorKind::UndefinedFunction,
            _ => ErrorKind::Other,
        }
    }
}

/// An error of this crate.
#[derive(Debug)]
pub enum Error {
    /// The database refused the call (see [`Error::kind`] and [`Error::sqlstate`]).
    Db(tokio_postgres::Error),
    /// No connection could be had from the pool.
    Pool(deadpool_postgres::PoolError),
    /// The server's pgque lacks a function this call needs.
    ServerFeatureMissing(&'static str),
    /// A partitioned consumer's worker lost its slot's lease to another worker.
    SlotLost { slot: i32 },
    /// A value the client refused before sending it.
    Invalid(String),
}

impl Error {
    /// The SQLSTATE-derived kind; [`ErrorKind::Other`] for non-database errors.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Db(e) => e.code().map(ErrorKind::from_sqlstate).unwrap_or(ErrorKind::Other),
            _ => ErrorKind::Other,
        }
    }

    /// The SQLSTATE of a database error.
    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            Error::Db(e) => e.code().map(|c| c.code()),
            _ => None,
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Db(e) => match e.as_db_error() {
                Some(db) => write!(f, "{} ({})", db.message(), db.code().code()),
                None => write!(f, "{e}"),
            },
            Error::Pool(e) => write!(f, "connection pool: {e}"),
            Error::ServerFeatureMissing(what) => write!(f, "this server's pgque has no {what}"),
            Error::SlotLost { slot } => write!(f, "slot {slot}: lease taken over by another worker"),
            Error::Invalid(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Db(e) => Some(e),
            Error::Pool(e) => Some(e),
            _ => None,
        }
    }
}

impl From<tokio_postgres::Error> for Error {
    fn from(e: tokio_postgres::Error) -> Self {
        Error::Db(e)
    }
}

impl From<deadpool_postgres::PoolError> for Error {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        Error::Pool(e)
    }
}

/// This crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
