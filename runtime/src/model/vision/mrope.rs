//! Multimodal rotary position ids (M-RoPE, Qwen2-VL and Qwen2.5-VL's `get_rope_index`, as verl's
//! own copy computes them before it packs sequences): three position ids per token (time,
//! height, width) for the language model's rotary embedding.
//!
//! Text tokens advance all three together. An image or video occupies its placeholder tokens
//! (one per merged patch, `t × h/merge × w/merge` of them, announced by the vision-start token
//! before the first): all start at the position after the preceding text, the height and width
//! ids count the merged patch's row and column, and the time id counts the temporal patch, in
//! steps of `seconds per temporal patch × tokens_per_second` (an image's is 0). The text after
//! resumes at one past the largest id so far. A padded row's padding gets position 1.
//! Qwen3-VL's processor puts a video's temporal patches apart, each behind its timestamp:
//! each is then a one-frame video of its own.

/// The special tokens and settings the ids depend on (a Qwen2.5-VL `config.json`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MropeTokens {
    pub image_token_id: i64,
    pub video_token_id: i64,
    pub vision_start_token_id: i64,
    pub spatial_merge_size: i64,
    /// `vision_config.tokens_per_second`.
    pub tokens_per_second: f64,
    /// Qwen3-VL's videos: the processor puts each temporal patch's tokens apart, behind a
    /// timestamp in text and a vision-start token of its own, and each takes positions as a
    /// one-frame video (its time told by the text, not by the time ids).
    pub timestamped_videos: bool,
}

/// A video's grid and the seconds one temporal patch spans.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VideoGrid {
    pub thw: [i64; 3],
    pub seconds_per_grid: f64,
}

/// Why position ids cannot be made.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MropeError {
    #[error("the tokens announce {announced} image(s) but {given} image grid(s) were given")]
    Images { announced: usize, given: usize },
    #[error("the tokens announce {announced} video(s) but {given} video grid(s) were given")]
    Videos { announced: usize, given: usize },
    #[error(
        "a vision placeholder of {needed} token(s) at position {at} runs past the sequence's end ({len})"
    )]
    Truncated {
        at: usize,
        needed: usize,
        len: usize,
    },
}

/// The ids of one sequence: (time, height, width) per token, the rope delta (largest id + 1 −
/// length) that generation adds to later positions, and the images and videos it used.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceIds {
    pub ids: [Vec<i64>; 3],
    pub delta: i64,
    pub images: usize,
    pub videos: usize,
}

/// The ids of one unpadded sequence whose images and videos have the grids `images` and
/// `videos` (consumed in order; the tokens say how many).
pub fn position_ids(
    tokens: &[i64],
    images: &[[i64; 3]],
    videos: &[VideoGrid],
    t: &MropeTokens,
) -> Result<SequenceIds, MropeError> {
    let announced = |id: i64| {
        tokens
            .windows(2)
            .filter(|w| w[0] == t.vision_start_token_id && w[1] == id)
            .count()
    };
    let (n_images, n_videos) = (announced(t.image_token_id), announced(t.video_token_id));
    if n_images > images.len() {
        return Err(MropeError::Images {
            announced: n_images,
            given: images.len(),
        });
    }
    if n_videos > videos.len() {
        return Err(MropeError::Videos {
            announced: n_videos,
            given: videos.len(),
        });
    }
    let mut ids: [Vec<i64>; 3] = Default::default();
    let mut next = 0i64;
    let push_text = |ids: &mut [Vec<i64>; 3], next: &mut i64, len: usize| {
        for i in 0..len as i64 {
            for axis in ids.iter_mut() {
                axis.push(*next + i);
            }
        }
        *next += len as i64;
    };
    let find = |id: i64, from: usize| {
        tokens[from.min(tokens.len())..]
            .iter()
            .position(|&x| x == id)
            .map(|p| p + from)
    };
    let (mut st, mut image, mut video) = (0usize, 0usize, 0usize);
    for _ in 0..n_images + n_videos {
        let ed_image = (image < n_images)
            .then(|| find(t.image_token_id, st))
            .flatten()
            .unwrap_or(tokens.len() + 1);
        let ed_video = (video < n_videos)
            .then(|| find(t.video_token_id, st))
            .flatten()
            .unwrap_or(tokens.len() + 1);
        let (ed, [gt, gh, gw], seconds) = if ed_image < ed_video {
            image += 1;
            (ed_image, images[image - 1], 0.0)
        } else {
            video += 1;
            let v = videos[video - 1];
            (ed_video, v.thw, v.seconds_per_grid)
        };
        let (lh, lw) = (gh / t.spatial_merge_size, gw / t.spatial_merge_size);
        let count = (gt * lh * lw).max(0) as usize;
        if ed > tokens.len() || ed + count > tokens.len() {
            return Err(MropeError::Truncated {
                at: ed.min(tokens.len()),
                needed: count,
                len: tokens.len(),
            });
        }
        push_text(&mut ids, &mut next, ed - st);
        let start = next;
        let mut largest = start - 1;
        for f in 0..gt {
            // verl multiplies in floating point, then truncates.
            let time = (f as f64 * seconds * t.tokens_per_second) as i64;
            for r in 0..lh {
                for c in 0..lw {
                    let v = [start + time, start + r, start + c];
                    for (axis, x) in ids.iter_mut().zip(v) {
                        axis.push(x);
                        largest = largest.max(x);
                    }
                }
            }
        }
        next = largest + 1;
        st = ed + count;
    }
    if st < tokens.len() {
        push_text(&mut ids, &mut next, tokens.len() - st);
    }
    Ok(SequenceIds {
        ids,
        delta: next - tokens.len() as i64,
        images: n_images,
        videos: n_videos,
    })
}

/// [`position_ids`] of each row of a left- or right-padded batch (`mask` 1 on real tokens),
/// padding at position 1, as `(3, rows × width)` row-major; and each row's delta.
pub fn batch_position_ids(
    rows: &[Vec<i64>],
    mask: &[Vec<i64>],
    images: &[[i64; 3]],
    videos: &[VideoGrid],
    t: &MropeTokens,
) -> Result<([Vec<i64>; 3], Vec<i64>), MropeError> {
    let frames: Vec<VideoGrid>;
    let videos = if t.timestamped_videos {
        frames = videos
            .iter()
            .flat_map(|v| {
                let [gt, gh, gw] = v.thw;
                (0..gt).map(move |_| VideoGrid {
                    thw: [1, gh, gw],
                    seconds_per_grid: 0.0,
                })
            })
            .collect();
        &frames[..]
    } else {
        videos
    };
    let (mut image, mut video) = (0usize, 0usize);
    let mut out: [Vec<i64>; 3] = Default::default();
    let mut deltas = Vec::with_capacity(rows.len());
    for (row, m) in rows.iter().zip(mask) {
        let real: Vec<i64> = row
            .iter()
            .zip(m)
            .filter(|(_, m)| **m == 1)
            .map(|(x, _)| *x)
            .collect();
        let seq = position_ids(
            &real,
            images.get(image..).unwrap_or_default(),
            videos.get(video..).unwrap_or_default(),
            t,
        )?;
        image += seq.images;
        video += seq.videos;
        let mut k = 0;
        for &mi in m {
            for (axis, own) in out.iter_mut().zip(&seq.ids) {
                axis.push(if mi == 1 { own[k] } else { 1 });
            }
            k += usize::from(mi == 1);
        }
        // transformers' delta counts the padded width.
        deltas.push(seq.delta + real.len() as i64 - row.len() as i64);
    }
    Ok((out, deltas))
}
