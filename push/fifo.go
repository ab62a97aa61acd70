package push

// fifo is a first-in, first-out queue on a slice. Popped slots are cleared
// so that the entries they held can be collected, and the slice is
// compacted once most of it is popped.
type fifo[T any] struct {
	items []T
	head  int
}

func (f *fifo[T]) len() int { return len(f.items) - f.head }

func (f *fifo[T]) push(v T) {
	if f.head > 0 && f.head >= len(f.items)/2 && len(f.items) == cap(f.items) {
		n := copy(f.items, f.items[f.head:])
		clear(f.items[n:])
		f.items, f.head = f.items[:n], 0
	}
	f.items = append(f.items, v)
}

// pop takes the oldest item; the caller knows len() > 0.
func (f *fifo[T]) pop() T {
	var zero T
	v := f.items[f.head]
	f.items[f.head] = zero
	f.head++
	if f.head == len(f.items) {
		f.items, f.head = f.items[:0], 0
	}
	return v
}

// each calls fn for every item, oldest first.
func (f *fifo[T]) each(fn func(T)) {
	for _, v := range f.items[f.head:] {
		fn(v)
	}
}

// reset empties the queue and lets its items be collected.
func (f *fifo[T]) reset() {
	clear(f.items)
	f.items, f.head = f.items[:0], 0
}
