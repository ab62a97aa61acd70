package relay

// offload runs fn on a goroutine of its own and waits for its result.
//
// A held poll parks its request's goroutine for up to a minute, and a
// goroutine keeps the stack its deepest call ever needed. Token checks
// (curve arithmetic) and store calls (SQL drivers) go deep; run on the
// request's goroutine they would double its stack for the whole hold, in
// every held poll. Run here, their stack is given back when they return.
func offload[T any](fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := fn()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}
