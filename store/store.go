// Package store defines the relay's storage contract: the domain types, the
// Store interface every backend implements, and the sentinel errors backends
// translate their driver errors into. The conformance suite in
// store/storetest is the executable form of this contract.
package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/flamenet/relay/device"
)

// Sentinel errors. Backends wrap driver errors into these so the HTTP layer
// can answer without knowing which database is underneath.
var (
	// ErrNotFound: the device (or other named thing) does not exist.
	ErrNotFound = errors.New("store: not found")
	// ErrUnknownDevice: a send named a recipient that is not registered.
	ErrUnknownDevice = errors.New("store: unknown device")
	// ErrConflict: a send reused an id with other recipients or payload.
	ErrConflict = errors.New("store: id conflict")
	// ErrQueueFull: a recipient is over its pending envelope or byte limit.
	ErrQueueFull = errors.New("store: queue full")
	// ErrHouseholdFull: the household's devices together are over the
	// household's pending byte limit. The error is a *HouseholdFullError.
	ErrHouseholdFull = errors.New("store: household full")
	// ErrCursorAhead: an ack named a cursor above the device's head. The
	// error is a *CursorAheadError, which carries the head.
	ErrCursorAhead = errors.New("store: cursor ahead")
	// ErrUnavailable: the database cannot be reached or did not answer in
	// time. The caller should retry later; nothing was changed.
	ErrUnavailable = errors.New("store: unavailable")
	// ErrNotWritable: Ping found a database that answers but cannot be
	// written (a standby, a file another user owns, a file replaced under
	// the relay). It comes with ErrUnavailable.
	ErrNotWritable = errors.New("store: cannot be written")
	// ErrRemoved: the device was removed at or after the moment the
	// caller's credential was issued (see IssuedAt in RegisterParams and
	// AckParams); nothing was created or changed.
	ErrRemoved = errors.New("store: device removed after the credential was issued")
	// ErrStaleEpoch: an acknowledgement was taken in another epoch than
	// the store's current one (see History); nothing was applied. The
	// error is a *StaleEpochError, which carries the current epoch.
	ErrStaleEpoch = errors.New("store: acknowledgement of another epoch")
)

// StaleEpochError reports the store's current epoch to an acknowledgement
// taken in another.
type StaleEpochError struct {
	Epoch string
}

func (e *StaleEpochError) Error() string {
	return fmt.Sprintf("store: acknowledgement of another epoch than the current %q", e.Epoch)
}

func (e *StaleEpochError) Is(target error) bool { return target == ErrStaleEpoch }

// History says which history of the store a relay is talking to.
//
// Epoch changes whenever the store's history may have gone back (a restore
// of an older copy, a failover to a standby that may lack the last
// commits): every seq a device was given belongs to the epoch current when
// it was given, and a cursor of one epoch means nothing in another. It is
// 16 characters of base64url.
//
// Instance changes whenever the store's server or file changed at all,
// even when its history did not (a failover to a synchronous standby, a
// restart): what a relay remembers of the store is read again then.
type History struct {
	Epoch    string
	Instance string
}

// CursorAheadError reports the highest seq the device was ever given.
type CursorAheadError struct {
	Head int64
}

func (e *CursorAheadError) Error() string {
	return fmt.Sprintf("store: cursor ahead of head %d", e.Head)
}

func (e *CursorAheadError) Is(target error) bool { return target == ErrCursorAhead }

// UnknownDeviceError names the first recipient that is not registered.
type UnknownDeviceError struct {
	Device string
}

func (e *UnknownDeviceError) Error() string {
	return fmt.Sprintf("store: unknown device %q", e.Device)
}

func (e *UnknownDeviceError) Is(target error) bool { return target == ErrUnknownDevice }

// QueueFullError names the first recipient over its pending limits.
type QueueFullError struct {
	Device string
}

func (e *QueueFullError) Error() string {
	return fmt.Sprintf("store: queue of device %q is full", e.Device)
}

func (e *QueueFullError) Is(target error) bool { return target == ErrQueueFull }

// HouseholdFullError names the household whose pending bytes a send would
// have brought over SendParams.MaxHouseholdPendingBytes.
type HouseholdFullError struct {
	Household string
}

func (e *HouseholdFullError) Error() string {
	return fmt.Sprintf("store: household %q holds too many pending bytes", e.Household)
}

func (e *HouseholdFullError) Is(target error) bool { return target == ErrHouseholdFull }

// Device is one registered app instance.
type Device struct {
	Household    string
	Name         string
	IdentityKey  []byte // 32-byte Ed25519 public key, or nil
	Push         device.PushTarget
	Cursor       int64 // highest seq acknowledged
	Head         int64 // highest seq ever given
	RegisteredAt time.Time
	LastSeen     time.Time
	// Epoch is the store's epoch as of the registration; set by Register
	// only.
	Epoch string
}

// RegisterParams creates or updates a device. A nil field leaves the stored
// value as it is, so a repeated register with an empty body changes nothing.
type RegisterParams struct {
	Household   string
	Device      string
	Push        *device.PushTarget
	IdentityKey []byte
	Now         time.Time
	// IssuedAt is when the caller's credential was issued (zero: unknown).
	// If the device was removed at or after it (or, for zero, ever), the
	// registration is refused with ErrRemoved, in the same statement that
	// would have written it: a credential of an earlier life never
	// brings the name back.
	IssuedAt time.Time
}

// SendParams is one send. To must be sorted and free of repeats; the store
// relies on that order to lock rows without deadlocks.
type SendParams struct {
	Household string
	Sender    string
	ID        string
	To        []string
	Payload   []byte
	Now       time.Time
	// Limits per recipient; a recipient that would exceed either gets
	// ErrQueueFull and nothing is stored. Zero means unlimited.
	MaxPendingEnvelopes int64
	MaxPendingBytes     int64
	// MaxHouseholdPendingBytes bounds the pending bytes of the household's
	// devices together: a send that would bring their sum, plus the payload
	// once per recipient, above it gets a *HouseholdFullError and nothing
	// is stored. Zero means unlimited.
	//
	// The sum is read inside the send without locking the household's
	// other devices (there is no per-household row every send would queue
	// on), so sends in flight at the same time to disjoint recipients do
	// not see each other: together they may overshoot the bound by at most
	// what they add. Recipients' own counters are exact. Checked after the
	// per-recipient limits.
	MaxHouseholdPendingBytes int64
}

// Delivery is one recipient's copy of a send.
type Delivery struct {
	Device string
	Seq    int64
	// Push is the recipient's push target: at commit time on a first send,
	// as it is now on a repeat. It is not part of the stored answer.
	Push device.PushTarget
	// Pending reports whether this recipient's copy is still stored (not
	// acknowledged, expired or removed with its device). Always true on a
	// first send.
	Pending bool
	// Life is the recipient's life the send was stored in (its last
	// removal as the send saw it): a caller handing the envelope to a
	// poll from memory checks the poll's token by it, as Fetch's Life is
	// used.
	Life device.Life
}

// SendResult is the answer to a send. Repeat is true when the same send was
// already stored: the deliveries carry the first answer's seqs, nothing new
// was stored, and each delivery says whether its copy is still pending and
// where its recipient's pushes go now. A repeat may follow a first answer
// that was lost after the commit, so the caller should wake and push the
// recipients whose copies are still pending, as after a first send.
type SendResult struct {
	ID         string
	Deliveries []Delivery // ordered by device
	Repeat     bool
}

// AckParams moves a device's cursor up to Cursor (never down) and deletes the
// envelopes at or below it. A device that does not exist yet is registered.
type AckParams struct {
	Household string
	Device    string
	// Cursor is the new cursor; a negative value acknowledges nothing and
	// only reports the position.
	Cursor int64
	Now    time.Time
	// IssuedAt is when the caller's credential was issued, as in
	// RegisterParams: a device removed at or after it is neither created
	// nor acknowledged for (ErrRemoved).
	IssuedAt time.Time
	// Epoch is the store's epoch the cursor was taken in (see History);
	// empty: not checked. If it is not the current one, nothing is
	// acknowledged and the error is a *StaleEpochError.
	Epoch string
}

// Ack is one entry of an AckMany batch.
type Ack struct {
	Household string
	Device    string
	// Cursor is the new cursor, clamped to the device's head; a negative
	// value acknowledges nothing and only records Seen.
	Cursor int64
	// Seen, when not zero, moves last_seen up to it (never down).
	Seen time.Time
	// Life is the device's life as the caller knew it when it took the
	// ack. If the device was removed after that, the ack belongs to an
	// earlier life of the name and is skipped: it must not acknowledge
	// what a new registration is owed.
	Life device.Life
	// Epoch is the store's epoch the ack was taken in (see History);
	// empty: not checked. An ack of another epoch than the current one
	// is skipped and counted as stale: its cursor counts seqs of a
	// history the store no longer holds.
	Epoch string
}

// AckManyResult is what an AckMany did.
type AckManyResult struct {
	Deleted int64 // envelopes deleted
	Stale   int   // acks skipped for being of another epoch
}

// DeviceState is where a device stands, read without writing anything.
type DeviceState struct {
	Exists bool
	Cursor int64       // zero when the device does not exist
	Head   int64       // zero when the device does not exist
	Life   device.Life // begun by the device's last removal
	Epoch  string      // the store's epoch, read in the same statement
}

// Position is where a device stands after an ack.
type Position struct {
	Cursor int64  // stored cursor
	Head   int64  // highest seq ever given
	Acked  int64  // envelopes this ack deleted
	Epoch  string // the store's epoch the position is of
}

// FetchParams reads envelopes above After.
type FetchParams struct {
	Household string
	Device    string
	After     int64
	Limit     int   // at most this many envelopes
	Budget    int64 // payload bytes; the first envelope is returned whatever its size
}

// Envelope is one stored copy of a send for one device.
type Envelope struct {
	Seq     int64
	ID      string
	From    string
	SentAt  time.Time
	Payload []byte
}

// Batch is the answer to a fetch. More is true when envelopes beyond the
// limit or budget are waiting.
type Batch struct {
	Envelopes []Envelope
	More      bool
	// Life is the device's life as seen by the same snapshot that read
	// the envelopes returned, so a caller holding an older view of the
	// device can tell that these envelopes may belong to a device
	// registered again since, and refuse them to a token issued before
	// the removal.
	Life device.Life
	// Epoch is the store's epoch, read in the same snapshot.
	Epoch string
}

// ListParams pages through a household's directory by device name.
type ListParams struct {
	Household string
	After     string // exclusive; "" starts at the beginning
	Limit     int
}

// ExpireParams deletes old data in batches of at most Batch rows.
type ExpireParams struct {
	EnvelopesBefore time.Time // envelopes sent before this are deleted
	SendsBefore     time.Time // send records older than this, with no envelope left, are deleted
	Batch           int
}

// ExpireResult counts what one expiry pass deleted.
type ExpireResult struct {
	Envelopes int64
	Sends     int64
}

// RelayHealth is one relay's report of its wake-ups, for the relays that
// share a store to learn of each other's trouble.
type RelayHealth struct {
	ID      string    // the relay process, unique among those sharing the store
	WakesOK bool      // its wake-ups flow: it publishes and hears its own
	At      time.Time // when it reported
}

// PoolStats describes a backend's connection pool, for metrics. A backend
// that has one implements PoolStatser.
type PoolStats struct {
	Max          int           // connections the pool may open
	Open         int           // connections open now
	InUse        int           // connections busy now
	WaitCount    int64         // acquisitions that had to wait, in total
	WaitDuration time.Duration // time spent waiting for a connection, in total
}

// PoolStatser is implemented by backends with a connection pool.
type PoolStatser interface {
	PoolStats() PoolStats
}

// Removal is a device's last removal.
type Removal struct {
	Household string
	Device    string
	At        time.Time
}

// Store is what the relay needs from a database: the union of the roles
// below, which the backends implement whole and store/storetest checks
// whole. A consumer takes the narrowest role it uses, so that its
// dependence on the store, and a fake of it, is no wider than its work.
// Every method takes ctx first so that a client that hangs up cancels its
// query.
type Store interface {
	Queue
	Directory
	Pairing
	Fleet
	Expiry
	Probe
	// Close releases the store's connections. It is its owner's, not a
	// role's: whoever opened the store closes it.
	Close() error
}

// Queue is the envelopes' way through the store and where each device
// stands in it: a send queues, a poll reads, an ack deletes. It is the
// API's hot path, what a poll or a send costs the store.
type Queue interface {
	// Send stores one envelope per recipient atomically, or nothing.
	Send(ctx context.Context, p SendParams) (SendResult, error)
	// Ack acknowledges up to p.Cursor and reports the position.
	Ack(ctx context.Context, p AckParams) (Position, error)
	// AckMany applies a batch of acks at once and reports how many
	// envelopes it deleted. For each device that exists, the cursor moves
	// to max(cursor, min(a.Cursor, head)): up only, never past the head.
	// The envelopes at or below it are deleted, and last_seen moves up to
	// a.Seen when that is not zero. A device named twice takes the highest
	// cursor and the latest Seen. Devices that do not exist are skipped:
	// not created, no error. Either every ack of the batch is applied or
	// none is.
	//
	// An ack names one life of a device through Life: one queued before
	// a removal the caller had not heard of is skipped, even if the name
	// was registered again meanwhile. An ack names the epoch it was taken
	// in: one of another epoch than the current one is skipped too, and
	// counted as stale, in the same transaction that applies the others.
	AckMany(ctx context.Context, acks []Ack) (AckManyResult, error)
	// State reads where a device stands without writing anything.
	State(ctx context.Context, household, device string) (DeviceState, error)
	// Fetch reads ids and sizes above p.After first, then loads only the
	// payloads inside the budget, and reports the device's last removal as
	// of the same read.
	Fetch(ctx context.Context, p FetchParams) (Batch, error)
}

// Directory is the devices themselves: which are registered, with which
// push target, and when each was last removed. Its calls are a device's
// first contact and a household's administration, not its traffic.
type Directory interface {
	// Register creates the device or updates its push target and
	// identity key, and returns it.
	Register(ctx context.Context, p RegisterParams) (Device, error)
	// Devices lists a household's devices ordered by name.
	Devices(ctx context.Context, p ListParams) ([]Device, error)
	// DeleteDevice removes a device, its envelopes, its invitations, the
	// unredeemed invitations it made and its renewal secrets, and records
	// the removal time. ErrNotFound when the device does not exist.
	DeleteDevice(ctx context.Context, household, device string, at time.Time) error
	// RemovedAt reports when the device was last removed; zero if never.
	RemovedAt(ctx context.Context, household, device string) (time.Time, error)
	// Removals lists the last removal of every device ever removed, at
	// most limit of them, in no particular order.
	Removals(ctx context.Context, limit int) ([]Removal, error)
	// ClearPush clears the device's push target if it is still target.
	ClearPush(ctx context.Context, household, device string, target device.PushTarget) error
}

// Pairing is the invitations and renewal secrets through which a device
// gets its credentials: the only calls made on behalf of a caller that
// holds no token yet.
type Pairing interface {
	// CreateInvitation stores an invitation, replacing the device's
	// unredeemed one if any. ErrDeviceExists when the device exists and
	// p.Replace is false.
	CreateInvitation(ctx context.Context, p InviteParams) error
	// CancelInvitation deletes the device's unredeemed invitation.
	// ErrNotFound when it has none.
	CancelInvitation(ctx context.Context, household, device string) error
	// Invitations lists a household's pending and recently redeemed
	// invitations, by device.
	Invitations(ctx context.Context, p InvitationsParams) ([]Invitation, error)
	// Pair redeems an invitation (see PairParams). A code that is unknown,
	// used, expired, created at or before the device's last removal, or
	// for a name that became a device it does not replace, is a
	// *RefusedError and changes nothing.
	Pair(ctx context.Context, p PairParams) (Grant, error)
	// Renew marks a renewal secret used and stores its successor, or
	// refuses it (a *RefusedError): unknown, expired, revoked, issued at
	// or before the device's last removal, or reused (see
	// RenewParams.Grace). Presenting a revoked or reused secret revokes
	// the device's every secret, committed before the refusal returns.
	Renew(ctx context.Context, p RenewParams) (Grant, error)
}

// Fleet is how the relays that share a store learn of each other's
// trouble; a relay alone never calls it.
type Fleet interface {
	// ReportHealth records r and returns the latest report of every relay
	// made at or after since, r's included, in one round trip.
	ReportHealth(ctx context.Context, r RelayHealth, since time.Time) ([]RelayHealth, error)
}

// Expiry is the deletion of what outlived its time: a background job's
// whole need of the store, on a timer and in batches of its own.
type Expiry interface {
	// Expire deletes expired envelopes and send records.
	Expire(ctx context.Context, p ExpireParams) (ExpireResult, error)
}

// Probe asks about the store itself rather than its data: whether it
// answers, and whether it is still the store, with the same history,
// that the relay's memory was filled from.
type Probe interface {
	// History reads the store's epoch and instance (see History).
	History(ctx context.Context) (History, error)
	// Ping checks the database on a connection of its own, not the pool's.
	Ping(ctx context.Context) error
}

// Recipients returns to sorted and without repeats: the order in which a
// backend locks recipients, and in which a send's deliveries are listed.
func Recipients(to []string) []string {
	to = slices.Clone(to)
	slices.Sort(to)
	return slices.Compact(to)
}

// Digest identifies a send's content for dedupe: the sorted recipients and
// the payload, each length-prefixed so that no two sends collide by shifting
// bytes between fields. Every backend stores this digest.
func Digest(sortedTo []string, payload []byte) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(sortedTo)))
	h.Write(n[:])
	for _, d := range sortedTo {
		binary.BigEndian.PutUint64(n[:], uint64(len(d)))
		h.Write(n[:])
		h.Write([]byte(d))
	}
	binary.BigEndian.PutUint64(n[:], uint64(len(payload)))
	h.Write(n[:])
	h.Write(payload)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}
