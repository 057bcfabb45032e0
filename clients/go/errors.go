package pgque

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs that pgque's functions raise for bad input (docs/errors.md).
// Each has a sentinel [Error] below for [errors.Is].
const (
	CodeNullValueNotAllowed    = "22004" // a required argument (or array element) is NULL
	CodeInvalidName            = "42602" // an empty name, a forbidden character, a '#' in a plain consumer
	CodeNameTooLong            = "42622" // a name over its byte limit
	CodeUndefinedObject        = "42704" // unknown queue, consumer, batch, job, dead letter...
	CodeInvalidParameterValue  = "22023" // an unacceptable value (bad interval, unequal arrays, wrong N...)
	CodeNumericValueOutOfRange = "22003" // a number outside its range (priority, limit, max_attempts...)
	CodeInvalidJSON            = "22P02" // text that is not JSON given to a jsonb argument
	CodeWrongState             = "55000" // a finished batch, a slot lease held by another worker...
	CodeDuplicateJob           = "23505" // a unique key held by a live job, with on_duplicate 'error'
	CodeFeatureNotSupported    = "0A000" // e.g. a job-log call at REPEATABLE READ
	CodeUndefinedFunction      = "42883" // a function the server's schema does not have
)

// kind tells the client-side errors apart (they carry no SQLSTATE).
type kind int

const (
	kindServer kind = iota
	kindServerFeatureMissing
	kindSlotLost
)

// Error is a failed pgque call. SQLState is PostgreSQL's code ("" for a
// client-side error: a feature the server lacks, a lost slot lease). The
// server's *pgconn.PgError, when there is one, is reachable with
// [errors.As] through Unwrap.
//
// Branch on the code, never on the message text: errors.Is(err,
// pgque.ErrUndefinedObject), or errors.As(err, &e) and e.SQLState.
type Error struct {
	// SQLState is the SQLSTATE of the server's error, "" for a client-side one.
	SQLState string
	// Message is the server's message (or the client's, for a client-side error).
	Message string
	// Cause is the underlying error (a *pgconn.PgError for a server error).
	Cause error
	kind  kind
	// sentinel marks the package's Err* values, which match by code.
	sentinel bool
}

// Error returns the message with its SQLSTATE.
func (e *Error) Error() string {
	if e.SQLState != "" {
		return fmt.Sprintf("pgque: %s (SQLSTATE %s)", e.Message, e.SQLState)
	}
	return "pgque: " + e.Message
}

// Unwrap returns the underlying error (the *pgconn.PgError of a server error).
func (e *Error) Unwrap() error { return e.Cause }

// Is reports whether target is a sentinel of this package that names e's
// SQLSTATE (or, for the client-side sentinels, e's kind).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || !t.sentinel {
		return false
	}
	if t.kind != kindServer {
		return t.kind == e.kind
	}
	return e.kind == kindServer && t.SQLState == e.SQLState
}

func sentinel(code, msg string) *Error {
	return &Error{SQLState: code, Message: msg, sentinel: true}
}

// Sentinels for errors.Is, one per SQLSTATE that pgque raises for bad input,
// and two client-side ones.
var (
	ErrNullValueNotAllowed    = sentinel(CodeNullValueNotAllowed, "null value not allowed")
	ErrInvalidName            = sentinel(CodeInvalidName, "invalid name")
	ErrNameTooLong            = sentinel(CodeNameTooLong, "name too long")
	ErrUndefinedObject        = sentinel(CodeUndefinedObject, "undefined object")
	ErrInvalidParameterValue  = sentinel(CodeInvalidParameterValue, "invalid parameter value")
	ErrNumericValueOutOfRange = sentinel(CodeNumericValueOutOfRange, "numeric value out of range")
	ErrInvalidJSON            = sentinel(CodeInvalidJSON, "invalid JSON")
	ErrWrongState             = sentinel(CodeWrongState, "object in the wrong state")
	ErrDuplicateJob           = sentinel(CodeDuplicateJob, "duplicate job")
	ErrFeatureNotSupported    = sentinel(CodeFeatureNotSupported, "feature not supported")
	// ErrServerFeatureMissing: the connected server's pgque has no such
	// function (enqueue_flow, set_progress, event headers on an older server).
	ErrServerFeatureMissing = &Error{Message: "server feature missing", kind: kindServerFeatureMissing, sentinel: true}
	// ErrSlotLost: a partitioned consumer's worker no longer holds its
	// slot's lease (another worker took it over, or the consumer was
	// resized); it stops processing that slot without acking.
	ErrSlotLost = &Error{Message: "slot lost", kind: kindSlotLost, sentinel: true}
)

// SQLState returns the SQLSTATE of err: of a pgque *Error, or of a
// *pgconn.PgError anywhere in its chain; "" when there is none.
func SQLState(err error) string {
	var e *Error
	if errors.As(err, &e) && e.SQLState != "" {
		return e.SQLState
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return pg.Code
	}
	return ""
}

// passThrough are the SQLSTATE classes about the server or the session
// rather than the call: connection (08), resources (53), operator
// intervention such as a cancel or shutdown (57), system (58), transaction
// rollback (40), invalid transaction state (25). They are left as pgx
// returned them, as the other clients do.
var passThrough = map[string]bool{"08": true, "53": true, "57": true, "58": true, "40": true, "25": true}

var known = map[string]bool{
	CodeNullValueNotAllowed: true, CodeInvalidName: true, CodeNameTooLong: true, CodeUndefinedObject: true,
	CodeInvalidParameterValue: true, CodeNumericValueOutOfRange: true, CodeInvalidJSON: true,
	CodeWrongState: true, CodeDuplicateJob: true, CodeFeatureNotSupported: true,
}

// translate returns err as a *Error when it is a server error of a call's
// own class (see passThrough), else err unchanged (nil stays nil; a lost
// connection or a context error is returned as it is).
func translate(err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return err
	}
	if !known[pg.Code] && (len(pg.Code) < 2 || passThrough[pg.Code[:2]]) {
		return err
	}
	return &Error{SQLState: pg.Code, Message: pg.Message, Cause: err}
}

// clientError is a client-side *Error: with code "" it is of kind k;
// with a code it is refused like the server would refuse it (e.g. 22023
// for an option the server's function does not have).
func clientError(code string, k kind, format string, a ...any) *Error {
	return &Error{SQLState: code, Message: fmt.Sprintf(format, a...), kind: k}
}

func featureMissing(format string, a ...any) *Error {
	return clientError("", kindServerFeatureMissing, format, a...)
}

func invalidParameter(format string, a ...any) *Error {
	return clientError(CodeInvalidParameterValue, kindServer, format, a...)
}
