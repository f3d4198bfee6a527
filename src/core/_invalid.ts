// edgelock's own checks of an argument throw these. To a caller they are a TypeError and a
// RangeError like any other (same name, same instanceof); to the service they mark a bad
// request, answered 400 with the message. Any other TypeError (a bug's "Cannot read properties
// of undefined") is answered 500 with nothing of its text.

/** A TypeError from edgelock's own check of an argument. */
export class InvalidType extends TypeError {}
/** A RangeError from edgelock's own check of an argument. */
export class InvalidRange extends RangeError {}
