//! `dormouse-broker`: the host side of Dormouse.
