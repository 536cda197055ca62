-- The training set's policy: which accepted images of the chosen sources train, and why each other one does not.
--
-- Run by DuckDB in the selection job (training_code/selection.py), statement by statement. docs/selection.md is the
-- contract: the relations and variables the job provides, and what a policy leaves (`decisions`, `selected`,
-- `near_duplicates`). Copy this file to write your own; the rules below, one step each, apply in order. Rules 1 to
-- 4 keep to narrow columns: the labels are read again for the selected images alone, at the end.

-- 1. Labels. An image with nothing to train on (no entry in its source's annotations.json, or a source configured
--    unlabelled) is left out; a source that treats unlisted images as negatives passes them here.
-- 2. Categories. With categories chosen, an image keeps only its boxes of those (`selected`, below): one that had
--    boxes but none of them is left out (it shows objects no label would name). A negative (no boxes) stays unless
--    negatives are off.
CREATE VIEW labelled AS
SELECT
    accepted.source, accepted.key, accepted.sha256, accepted.split,
    CASE
        WHEN annotation_reasons.reason IS NOT NULL THEN 'not_annotated'
        WHEN len(category_names) > 0 AND len(getvariable('categories')) > 0
             AND NOT list_has_any(category_names, getvariable('categories')) THEN 'outside_categories'
        WHEN len(category_names) = 0 AND NOT getvariable('negatives') THEN 'negative'
    END AS rule,
    CASE WHEN annotation_reasons.reason IS NOT NULL THEN accepted.annotation END AS detail
FROM accepted LEFT JOIN annotation_reasons USING (annotation);

-- 3. Exact duplicates across sources. Of the eligible images with one sha256, the one in the source whose name sorts
--    first is kept (validation already kept one copy per source): this table names it for each such sha256.
CREATE TABLE duplicated AS
WITH shared AS (  -- grouped by a 64-bit hash of the sha256 first (cheap); a collision is undone by the next step
    SELECT hash(sha256) AS shared FROM labelled WHERE rule IS NULL GROUP BY ALL HAVING count(*) > 1
)
SELECT sha256, min({'source': source, 'key': key}) AS kept
FROM labelled SEMI JOIN shared ON shared.shared = hash(labelled.sha256)
WHERE rule IS NULL
GROUP BY sha256
HAVING count(*) > 1;

CREATE VIEW eligible AS
SELECT
    labelled.source, labelled.key, labelled.sha256, labelled.split,
    CASE WHEN duplicated.kept.source <> labelled.source THEN 'duplicate' END AS rule,
    CASE WHEN duplicated.kept.source <> labelled.source THEN duplicated.kept.key END AS detail
FROM labelled LEFT JOIN duplicated USING (sha256)
WHERE labelled.rule IS NULL;

-- 4. Caps. A source keeps at most its cap (source_caps, else max_images_per_source); with max_images the sources
--    share that total by source_weights (1 unless given, 0 takes none): a source with fewer images than its share
--    leaves the rest to the others (the water level at which the shares add up to the total), in whole images, the
--    last few to the largest remainders. A source keeps the images whose sha256 sorts lowest: a function of the
--    content alone, stable as a source grows. This table is each source's quota, and why the rest are left out.
CREATE TABLE quotas AS
WITH
available AS (
    SELECT
        source,
        count(*) AS images,
        least(count(*), coalesce(any_value(source_caps.cap), getvariable('max_images_per_source'), count(*)))
            AS capped,
        CASE
            WHEN any_value(source_caps.cap) IS NOT NULL
                THEN 'over the cap of ' || any_value(source_caps.cap) || ' images for source ' || source
            WHEN getvariable('max_images_per_source') IS NOT NULL
                THEN 'over the cap of ' || getvariable('max_images_per_source') || ' images per source'
        END AS cap_reason,
        coalesce(any_value(source_weights.weight), 1.0) AS weight
    FROM eligible
    LEFT JOIN source_caps USING (source)
    LEFT JOIN source_weights USING (source)
    WHERE eligible.rule IS NULL
    GROUP BY source
),
sharing AS (  -- the sources that share max_images, in the order they fill up (capped / weight)
    SELECT
        *,
        row_number() OVER filling AS position,
        capped / weight AS fills_at,
        coalesce(sum(capped) OVER (filling ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS capped_before,
        sum(weight) OVER (filling ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS weight_from
    FROM available
    WHERE getvariable('max_images') IS NOT NULL AND weight > 0 AND capped > 0
    WINDOW filling AS (ORDER BY capped / weight, source)
),
total AS (SELECT least(getvariable('max_images'), sum(capped)) AS images FROM sharing),
water AS (  -- the first source not filled to its cap: those before it are, it and the rest share what is left
    SELECT sharing.position, total.images - sharing.capped_before AS left_over, sharing.weight_from
    FROM sharing, total
    WHERE sharing.capped_before + sharing.fills_at * sharing.weight_from >= total.images
    ORDER BY sharing.position
    LIMIT 1
),
ideal AS (
    SELECT
        sharing.source,
        CASE WHEN sharing.position < water.position THEN sharing.capped
             ELSE least(sharing.capped, water.left_over * sharing.weight / water.weight_from)
        END AS share
    FROM sharing, water
),
rounded AS (
    SELECT
        source,
        floor(share)::BIGINT AS whole,
        row_number() OVER (ORDER BY share - floor(share) DESC, source) AS by_remainder
    FROM ideal
),
shares AS (
    SELECT
        available.*,
        CASE WHEN getvariable('max_images') IS NULL THEN available.capped
             ELSE coalesce(rounded.whole + (rounded.by_remainder
                  <= (SELECT images FROM total) - (SELECT sum(whole) FROM rounded))::INTEGER, 0)
        END AS quota
    FROM available LEFT JOIN rounded USING (source)
)
SELECT
    source,
    images,
    quota,
    CASE WHEN quota < capped
         THEN 'over source ' || source || '''s share of max_images ' || getvariable('max_images') || ': ' || quota
         ELSE cap_reason
    END AS reason
FROM shares;

-- Where each source over its quota stops: its images sorted by sha256 are taken bucket by bucket (a bucket: the
-- sha256's first three hex digits), so only the bucket where the quota falls is ranked image by image.
CREATE TABLE cutoffs AS
WITH buckets AS (
    SELECT eligible.source, left(eligible.sha256, 3) AS bucket, count(*) AS images
    FROM eligible JOIN quotas ON quotas.source = eligible.source AND quotas.quota < quotas.images
    WHERE eligible.rule IS NULL
    GROUP BY ALL
),
running AS (
    SELECT *, sum(images) OVER (PARTITION BY source ORDER BY bucket ROWS UNBOUNDED PRECEDING) - images AS before
    FROM buckets
)
SELECT running.source, running.bucket, quotas.quota - running.before AS keep
FROM running JOIN quotas USING (source)
WHERE running.before < quotas.quota AND quotas.quota <= running.before + running.images;

-- Rules 1 to 4 applied: each accepted image's rule (none: kept so far). `detail` is an unannotated image's annotation
-- state, or the image a duplicate copies.
CREATE TABLE ruled AS
WITH capped AS NOT MATERIALIZED (
    SELECT eligible.source, eligible.key, eligible.sha256, eligible.split, left(eligible.sha256, 3) AS bucket,
           cutoffs.bucket AS cutoff, cutoffs.keep
    FROM eligible
    JOIN quotas ON quotas.source = eligible.source AND quotas.quota < quotas.images
    LEFT JOIN cutoffs ON cutoffs.source = eligible.source
    WHERE eligible.rule IS NULL
)
SELECT source, key, split, CASE WHEN cutoff IS NULL OR bucket > cutoff THEN 'over_cap' END AS rule, NULL AS detail
FROM capped WHERE bucket <> cutoff OR cutoff IS NULL
UNION ALL
SELECT source, key, split,
       CASE WHEN row_number() OVER (PARTITION BY source ORDER BY sha256, key) > keep THEN 'over_cap' END, NULL
FROM capped WHERE bucket = cutoff
UNION ALL
SELECT eligible.source, eligible.key, eligible.split, NULL, NULL
FROM eligible JOIN quotas ON quotas.source = eligible.source AND quotas.quota >= quotas.images
WHERE eligible.rule IS NULL
UNION ALL
SELECT source, key, split, rule, detail FROM eligible WHERE rule IS NOT NULL
UNION ALL
SELECT source, key, split, rule, detail FROM labelled WHERE rule IS NOT NULL;

-- 5. Near-duplicates (re-encoded, resized, cropped copies) among the images kept so far. Images with the same
--    hashes are near-duplicates of each other whatever their number: they share a look, and looks are compared,
--    not images. A pair of looks is a candidate when one's whole picture and a view of the other's (the whole, or
--    a centre crop) are equal on a band of the bits of their pHash and difference hash (band_masks); it counts
--    when their pHashes are within near_duplicate_max_distance bits and their difference hashes, an independent
--    signal, within near_duplicate_confirm_distance. Pairs join into clusters.
CREATE TABLE looks AS
SELECT
    row_number() OVER () AS look, phash, dhash, images,
    phash[1] AS phash_whole, dhash[1] AS dhash_whole,  -- the whole picture's
    phash[2] AS phash_95, dhash[2] AS dhash_95,  -- its centre 95%
    phash[3] AS phash_90, dhash[3] AS dhash_90  -- its centre 90%
FROM (
    SELECT accepted.phash, accepted.dhash, count(*) AS images
    FROM ruled JOIN accepted USING (source, key)
    WHERE ruled.rule IS NULL
    GROUP BY accepted.phash, accepted.dhash
);

CREATE TABLE kept_images AS
SELECT ruled.source, ruled.key, accepted."group", ruled.split, looks.look
FROM ruled JOIN accepted USING (source, key) JOIN looks ON looks.phash = accepted.phash AND looks.dhash = accepted.dhash
WHERE ruled.rule IS NULL;

CREATE TABLE near_pairs AS
WITH
-- A band's key: its number and its bits, hashed into one value (a collision only adds a candidate, which the
-- distances then turn down).
whole AS (
    SELECT look, phash_whole AS phash, dhash_whole AS dhash,
           hash(band, phash_whole & phash_mask, dhash_whole & dhash_mask) AS band_key
    FROM looks, band_masks
),
views AS (
    SELECT look, phash_whole AS phash, dhash_whole AS dhash FROM looks
    UNION ALL SELECT look, phash_95, dhash_95 FROM looks
    UNION ALL SELECT look, phash_90, dhash_90 FROM looks
),
view_bands AS (
    SELECT views.*, hash(band, views.phash & phash_mask, views.dhash & dhash_mask) AS band_key
    FROM views, band_masks
)
SELECT DISTINCT least(whole.look, other.look) AS a, greatest(whole.look, other.look) AS b
FROM view_bands AS other
JOIN whole ON whole.band_key = other.band_key AND whole.look <> other.look
WHERE bit_count(xor(whole.phash, other.phash)) <= getvariable('near_duplicate_max_distance')
  AND bit_count(xor(whole.dhash, other.dhash)) <= getvariable('near_duplicate_confirm_distance');

-- Each look's cluster: the smallest look linked to it, spread along the pairs until nothing changes; a look of
-- several images is a cluster of its own where nothing links it.
CREATE TABLE clusters AS
WITH RECURSIVE edges AS (
    SELECT a AS look, b AS other FROM near_pairs UNION ALL SELECT b, a FROM near_pairs
),
cluster_of(look, cluster) USING KEY (look) AS (
    SELECT DISTINCT look, look FROM edges
    UNION
    SELECT edges.other, min(cluster_of.cluster)
    FROM cluster_of
    JOIN edges ON edges.look = cluster_of.look
    JOIN recurring.cluster_of AS now ON now.look = edges.other
    WHERE cluster_of.cluster < now.cluster
    GROUP BY edges.other
)
SELECT look, cluster FROM cluster_of
UNION ALL
SELECT look, look FROM looks WHERE images > 1 AND look NOT IN (SELECT a FROM near_pairs UNION SELECT b FROM near_pairs);

-- 6. A cluster never straddles train and val, and is resolved per image: in a cluster with a train image, each val
--    image leaves val, excluded, naming the train image it copies (one of its look, else of a look it pairs
--    with, else the cluster's first). No validation group moves as a whole: a chance link costs the images it links.
CREATE TABLE near_duplicates AS
WITH
members AS (
    SELECT kept_images.*, clusters.cluster FROM kept_images JOIN clusters USING (look)
),
named AS (  -- a cluster by its first image, and its first train image (by source, then key)
    SELECT
        cluster,
        min({'source': source, 'key': key}).key AS first,
        min({'source': source, 'key': key}) FILTER (split = 'train').key AS first_train
    FROM members
    GROUP BY cluster
),
look_train AS (  -- each look's first train image
    SELECT look, min({'source': source, 'key': key}).key AS train FROM members WHERE split = 'train' GROUP BY look
),
paired_train AS (  -- the first train image of the looks each look pairs with
    SELECT pairs.look, min(look_train.train) AS train
    FROM (SELECT a AS look, b AS other FROM near_pairs UNION ALL SELECT b, a FROM near_pairs) AS pairs
    JOIN look_train ON look_train.look = pairs.other
    GROUP BY pairs.look
),
fates AS (
    SELECT
        members.*,
        named.first AS cluster_key,
        CASE WHEN members.split = 'val'
             THEN coalesce(look_train.train, paired_train.train, named.first_train) END AS copy_of
    FROM members
    JOIN named USING (cluster)
    LEFT JOIN look_train USING (look)
    LEFT JOIN paired_train USING (look)
)
SELECT
    cluster_key AS cluster,
    source,
    key,
    "group",
    split AS validated_split,
    CASE WHEN copy_of IS NOT NULL THEN 'left val' ELSE split END AS outcome,
    copy_of
FROM fates;

-- Every accepted image once: selected (no rule) or the rule that left it out, why, and the image it copies.
CREATE VIEW decisions AS
SELECT
    ruled.source,
    ruled.key,
    ruled.split,
    coalesce(ruled.rule, CASE WHEN near.copy_of IS NOT NULL THEN 'near_duplicate' END) AS rule,
    CASE coalesce(ruled.rule, CASE WHEN near.copy_of IS NOT NULL THEN 'near_duplicate' END)
        WHEN 'not_annotated' THEN annotation_reasons.reason
        WHEN 'outside_categories' THEN 'no box of the chosen categories'
        WHEN 'negative' THEN 'a negative (no boxes), and negatives are off'
        WHEN 'duplicate' THEN 'duplicate of an image kept in source ' || split_part(ruled.detail, '/', 1)
        WHEN 'over_cap' THEN quotas.reason
        WHEN 'near_duplicate' THEN 'near-duplicate of train image ' || near.copy_of
    END AS reason,
    CASE WHEN ruled.rule = 'duplicate' THEN ruled.detail ELSE near.copy_of END AS copy_of
FROM ruled
LEFT JOIN near_duplicates AS near ON near.source = ruled.source AND near.key = ruled.key AND ruled.rule IS NULL
LEFT JOIN quotas ON quotas.source = ruled.source AND ruled.rule = 'over_cap'
LEFT JOIN annotation_reasons ON annotation_reasons.annotation = ruled.detail AND ruled.rule = 'not_annotated';

-- The selected images as packing reads them, their boxes narrowed to the chosen categories.
CREATE VIEW selected AS
SELECT
    accepted.* EXCLUDE (boxes, category_names, annotation, phash, dhash),
    CASE WHEN len(getvariable('categories')) = 0 THEN boxes
         ELSE list_filter(boxes, lambda box, i: list_contains(getvariable('categories'), category_names[i]))
    END AS boxes,
    CASE WHEN len(getvariable('categories')) = 0 THEN category_names
         ELSE list_filter(category_names, lambda name: list_contains(getvariable('categories'), name))
    END AS category_names
FROM accepted SEMI JOIN (SELECT source, key FROM decisions WHERE rule IS NULL) AS chosen USING (source, key);
