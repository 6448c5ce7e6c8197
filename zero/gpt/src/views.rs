//! Carving a flat buffer into named views by a size table.

/// Splits `buf` into `K` consecutive views of the given lengths (the rest, if any, is left
/// out). Callers pass lengths from a size table they already checked against `buf`.
///
/// # Panics
/// If the lengths add up to more than `buf.len()`.
pub(crate) fn carve<const K: usize>(mut buf: &[f32], lens: [usize; K]) -> [&[f32]; K] {
    lens.map(|len| {
        let (head, tail) = buf.split_at(len);
        buf = tail;
        head
    })
}

/// The mutable twin of [`carve`]: `K` disjoint mutable views.
///
/// # Panics
/// If the lengths add up to more than `buf.len()`.
pub(crate) fn carve_mut<const K: usize>(mut buf: &mut [f32], lens: [usize; K]) -> [&mut [f32]; K] {
    lens.map(|len| {
        let (head, tail) = std::mem::take(&mut buf).split_at_mut(len);
        buf = tail;
        head
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_are_consecutive_and_disjoint() {
        let mut buf: Vec<f32> = (0..10).map(|i| i as f32).collect();
        let [a, b, c] = carve_mut(&mut buf, [2, 3, 4]);
        a[0] = -1.0;
        assert_eq!((b[0], c[3]), (2.0, 8.0));
        let [x, y] = carve(&buf, [1, 9]);
        assert_eq!((x, y[0]), (&[-1.0][..], 1.0));
    }
}
