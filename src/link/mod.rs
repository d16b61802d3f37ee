//! The stream of resvals to the controller (Cap'n Proto over TCP) and the reference receiver.
